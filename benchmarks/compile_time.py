"""How long the first compiled update takes (``compile_model=True``), with inductor's caches empty and
with the caches an earlier process left.

Each measurement runs in a fresh process: the reference model (``bench_updates.trained_model`` with no
warm-up, the working tree) fills its replay with full windows, then its first update is timed
(tracing, compiling and one update), then ``--updates`` more. The first process gets an empty inductor cache folder
(``TORCHINDUCTOR_CACHE_DIR``, a new temporary one), as on a machine that never compiled the update; the
next ``--warm-runs`` processes reuse that folder, as a user's later runs on the same machine do. The
package's own C++ kernels are built once per machine and torch version (``TORCH_EXTENSIONS_DIR``)
before the timed update, so they are not in these figures.

    python benchmarks/compile_time.py --threads 2 --length 64
    python benchmarks/compile_time.py --length 256 --warm-runs 3 --name compile_time_L256

Results: ``benchmarks/results/compile_time.json`` / ``.md`` (``--name`` changes the file name).
"""

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from common import REPO, RESULTS_DIR, print_and_write
from compare_commits import load_average, run_script

#: The measuring process, run by :func:`compare_commits.run_script` (of its arguments it reads threads,
#: length and updates; the model is always compiled, in fp32).
MEASURE = """
import json, sys, time, torch as th
th.set_num_threads(int(sys.argv[1]))
from bench_updates import trained_model
length, updates = int(sys.argv[2]), int(sys.argv[3])
model = trained_model(length, compile_model=True, warmup_updates=0)
start = time.perf_counter()
model.train(gradient_steps=1, batch_size=8)
first = time.perf_counter() - start
start = time.perf_counter()
model.train(gradient_steps=updates, batch_size=8)
print(json.dumps({"first_update_s": first, "update_ms": 1e3 * (time.perf_counter() - start) / updates}))
"""


def first_update(cache_dir: Path, threads: int, length: int, updates: int) -> dict[str, float]:
    """The first update's seconds and the next updates' mean milliseconds, in a fresh process of the working
    tree (:func:`compare_commits.run_script`) whose inductor cache is ``cache_dir``, with the 1-minute load
    average read before it starts."""
    load = load_average()
    out = run_script(MEASURE, REPO, threads, length, updates, extra_env={"TORCHINDUCTOR_CACHE_DIR": str(cache_dir)})
    return {**json.loads(out), "load_average": load}


def measured_runs(threads: int, length: int, updates: int, warm_runs: int) -> list[dict[str, float]]:
    """:func:`first_update` in ``1 + warm_runs`` fresh processes sharing one inductor cache folder, new and
    empty for the first of them, removed after the last."""
    with tempfile.TemporaryDirectory(prefix="inductor_cache_") as cache:
        return [first_update(Path(cache), threads, length, updates) for _ in range(1 + warm_runs)]


def figures(runs: list[dict[str, float]]) -> dict[str, dict[str, Any]]:
    """The first process's first update (empty cache) and the median of the later ones' (cached)."""
    cold, warm = runs[0], runs[1:]
    return {
        "first_update_empty_cache": {
            "value": round(cold["first_update_s"], 1),
            "unit": "s (tracing, compiling and one update)",
            "next_updates_ms": round(cold["update_ms"], 1),
            "load_average": round(cold["load_average"], 2),
        },
        "first_update_cached": {
            "value": round(statistics.median(run["first_update_s"] for run in warm), 1),
            "unit": f"s (median of {len(warm)} later processes reusing the cache)",
            "runs_s": [round(run["first_update_s"], 1) for run in warm],
            "next_updates_ms": [round(run["update_ms"], 1) for run in warm],
            "load_average_range": f"{min(r['load_average'] for r in warm):.2f}-{max(r['load_average'] for r in warm):.2f}",
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--warm-runs", type=int, default=2, help="processes after the first, reusing its cache")
    parser.add_argument("--updates", type=int, default=20, help="updates timed after the first")
    parser.add_argument("--name", default="compile_time")
    args = parser.parse_args()
    if args.warm_runs < 1:
        parser.error("--warm-runs must be at least 1: the cached figure is taken from the processes after the first")
    runs = measured_runs(args.threads, args.length, args.updates, args.warm_runs)
    print(json.dumps(runs))
    config = {"threads": args.threads, "length": args.length, "updates": args.updates, "warm_runs": args.warm_runs}
    print_and_write(args.name, config, figures(runs), RESULTS_DIR)


if __name__ == "__main__":
    main()
