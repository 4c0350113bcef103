"""Updates per second with another memory allocator preloaded into the process (``LD_PRELOAD``).

A CPU update allocates many blocks: its tensors, and oneDNN's descriptors, about 180 small blocks per
matrix product. Each measurement runs in a fresh process (``bench_updates.updates_per_second`` at the
reference configuration, the working tree), one per allocator in turn, ``--rounds`` times per window
length: glibc's own malloc (no preload) and each library of ``--allocators`` that the dynamic loader
finds (``ctypes.util.find_library``; a missing one is recorded as such and skipped). The median of
each allocator's runs and the median of its per-round ratios to glibc's are reported, with the load
average beside every figure. Linux only.

    python benchmarks/allocators.py --threads 2 --rounds 3 --compile
    python benchmarks/allocators.py --lengths 64 --allocators tcmalloc_minimal --rounds 5

Results: ``benchmarks/results/allocators.json`` / ``.md`` (``--name`` changes the file name).
"""

import argparse
import ctypes.util
import statistics

from common import RESULTS_DIR, write_results
from compare_commits import measure_rounds

#: The baseline: no preload, glibc's malloc.
GLIBC = "glibc"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--updates", type=int, default=20, help="timed updates per measurement")
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256])
    parser.add_argument(
        "--allocators",
        nargs="+",
        default=["tcmalloc_minimal", "jemalloc"],
        help="library names as ctypes.util.find_library takes them (tcmalloc_minimal for libtcmalloc_minimal.so)",
    )
    parser.add_argument("--compile", action="store_true", help="the update compiled (compile_model=True)")
    parser.add_argument("--name", default="allocators")
    args = parser.parse_args()
    preloads = {GLIBC: None} | {name: ctypes.util.find_library(name) for name in args.allocators}
    missing = [name for name, path in preloads.items() if name != GLIBC and path is None]
    for name in missing:
        print(
            f"{name}: not found by the dynamic loader (install it, e.g. apt-get install libtcmalloc-minimal4 libjemalloc2); skipped"
        )
    sides = {name: path for name, path in preloads.items() if name == GLIBC or path is not None}
    figures: dict[str, dict] = {}
    settings = {
        name: {"extra_env": {"LD_PRELOAD": path} if path else None, "compile_model": args.compile}
        for name, path in sides.items()
    }
    for length in args.lengths:
        result = measure_rounds(settings, args.threads, length, args.updates, args.rounds, label=f"L={length} ")
        for name, path in sides.items():
            figures[f"{name}_L{length}"] = {
                "value": result.median(name),
                "unit": "updates/s (median)",
                "ratio_to_glibc": round(statistics.median(result.ratios(name, GLIBC)), 3),
                "runs": [round(v, 3) for v in result.runs[name]],
                "preload": path or "none",
                "load_average_range": result.load_range,
            }
            print(f"L={length} {name}: {figures[f'{name}_L{length}']}")
    config = {
        "threads": args.threads,
        "rounds": args.rounds,
        "updates_per_measurement": args.updates,
        "compile_model": args.compile,
        "allocators": list(sides),
        "not_found": missing,
    }
    write_results(args.name, config, figures, RESULTS_DIR)


if __name__ == "__main__":
    main()
