"""Updates per second with another memory allocator preloaded into the process (``LD_PRELOAD``), or
with glibc's malloc on transparent huge pages.

A CPU update allocates many blocks: its tensors, and oneDNN's descriptors, about 180 small blocks per
matrix product. Each measurement runs in a fresh process (``bench_updates.updates_per_second`` at the
reference configuration, the working tree), one per allocator in turn, ``--rounds`` times per window
length: glibc's own malloc (no preload) and each library of ``--allocators`` that the dynamic loader
finds (``ctypes.util.find_library``; a missing one is recorded as such and skipped). With ``--thp``,
also glibc's malloc with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``: it asks the kernel for
transparent huge pages (2 MB) for the memory it takes, so the update's tensors need fewer page-table
entries (glibc 2.35 or later; the kernel's ``transparent_hugepage/enabled`` must be ``madvise`` or
``always``, recorded with the results). The median of each side's runs and the median of its
per-round ratios to glibc's are reported, with the load average beside every figure. Linux only.

    python benchmarks/allocators.py --threads 2 --rounds 3 --compile
    python benchmarks/allocators.py --lengths 64 --allocators tcmalloc_minimal --rounds 5
    python benchmarks/allocators.py --allocators --thp --rounds 4

Results: ``benchmarks/results/allocators.json`` / ``.md`` (``--name`` changes the file name).
"""

import argparse
import ctypes.util
import platform
import statistics
from pathlib import Path

from common import RESULTS_DIR, write_results
from compare_commits import measure_rounds

#: The baseline: no preload, glibc's malloc.
GLIBC = "glibc"
#: glibc's malloc asking for transparent huge pages (``--thp``).
GLIBC_THP = "glibc_thp"
THP_TUNABLE = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_mode() -> str:
    """The kernel's transparent huge page mode (the bracketed word of ``THP_SETTING``), or ``unknown``."""
    try:
        text = THP_SETTING.read_text()
    except OSError:
        return "unknown"
    return text[text.find("[") + 1 : text.find("]")] if "[" in text else "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--updates", type=int, default=20, help="timed updates per measurement")
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256])
    parser.add_argument(
        "--allocators",
        nargs="*",
        default=["tcmalloc_minimal", "jemalloc"],
        help="library names as ctypes.util.find_library takes them (tcmalloc_minimal for libtcmalloc_minimal.so); "
        "none: only glibc's sides",
    )
    parser.add_argument("--thp", action="store_true", help="also glibc's malloc on transparent huge pages")
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
    envs: dict[str, dict[str, str] | None] = {name: {"LD_PRELOAD": path} if path else None for name, path in sides.items()}
    if args.thp:
        if thp_mode() in ("madvise", "always"):
            envs[GLIBC_THP] = THP_TUNABLE
        else:
            print(f"{GLIBC_THP}: the kernel's transparent huge pages are {thp_mode()!r} ({THP_SETTING}); skipped")
    figures: dict[str, dict] = {}
    settings = {name: {"extra_env": env, "compile_model": args.compile} for name, env in envs.items()}
    for length in args.lengths:
        result = measure_rounds(
            settings, args.threads, length, args.updates, args.rounds, alternate=True, label=f"L={length} "
        )
        for name, env in envs.items():
            figures[f"{name}_L{length}"] = {
                "value": result.median(name),
                "unit": "updates/s (median)",
                "ratio_to_glibc": round(statistics.median(result.ratios(name, GLIBC)), 3),
                "runs": [round(v, 3) for v in result.runs[name]],
                "environment": " ".join(f"{k}={v}" for k, v in (env or {}).items()) or "none",
                "load_average_range": result.load_range,
            }
            print(f"L={length} {name}: {figures[f'{name}_L{length}']}")
    config = {
        "threads": args.threads,
        "rounds": args.rounds,
        "updates_per_measurement": args.updates,
        "compile_model": args.compile,
        "allocators": list(envs),
        "not_found": missing,
        "transparent_hugepage": thp_mode(),
        "glibc": platform.libc_ver()[1],
    }
    write_results(args.name, config, figures, RESULTS_DIR)


if __name__ == "__main__":
    main()
