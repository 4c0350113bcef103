"""Updates per second of two versions of the package, measured side by side in one run.

A git worktree of ``--base`` is made in a temporary folder; each measurement runs in a fresh process
(``bench_updates.updates_per_second`` at the reference configuration), alternating base and the
working tree, ``--rounds`` times per window length. Both sides see the same machine state, so their
ratio holds even where absolute figures drift between runs; the median of each side and the median
of the per-round ratios are reported, with the load average beside every figure.

    python benchmarks/compare_commits.py --base b580c91 --threads 2 --rounds 5
    python benchmarks/compare_commits.py --base HEAD~3 --lengths 64 --rounds 3 --updates 10
    python benchmarks/compare_commits.py --base HEAD~1 --precision bf16 --name compare_commits_bf16
    python benchmarks/compare_commits.py --base b580c91 --precision bf16 --base-precision fp32   # bf16 against an fp32 base
    python benchmarks/compare_commits.py --base b580c91 --compile   # the working tree with compile_model=True

Results: ``benchmarks/results/compare_commits.json`` / ``.md`` (``--name`` changes the file name).
"""

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from common import REPO, RESULTS_DIR, git_worktree, short_commit, write_results

MEASURE = """
import sys, torch as th
th.set_num_threads(int(sys.argv[1]))
from bench_updates import updates_per_second
print(updates_per_second(int(sys.argv[2]), int(sys.argv[3]), mixed_precision=sys.argv[4] == "bf16", compile_model=sys.argv[5] == "1"))
"""


def measure(
    tree: Path,
    threads: int,
    length: int,
    updates: int,
    precision: str = "fp32",
    extra_env: dict[str, str] | None = None,
    compile_model: bool = False,
) -> float:
    """Updates/s of the package in ``tree``, in a fresh process that imports it from there
    (``precision`` ``"bf16"``: under bf16 autocast; ``extra_env``: more environment variables;
    ``compile_model``: the update's forward compiled)."""
    env = {**os.environ, "PYTHONPATH": str(tree), **(extra_env or {})}
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(threads), str(length), str(updates), precision, str(int(compile_model))],
        cwd=tree / "benchmarks",
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def load_average() -> float:
    return os.getloadavg()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="git revision to compare the working tree against")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=20, help="timed updates per measurement")
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256])
    parser.add_argument(
        "--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: the working tree under bf16 autocast"
    )
    parser.add_argument(
        "--base-precision", choices=["fp32", "bf16"], default=None, help="the base's precision (default: --precision)"
    )
    parser.add_argument("--compile", action="store_true", help="the working tree with compile_model=True (the base eager)")
    parser.add_argument("--name", default="compare_commits")
    args = parser.parse_args()
    base_commit = short_commit(args.base)
    precision = {"base": args.base_precision or args.precision, "new": args.precision}
    figures: dict[str, dict] = {}
    with git_worktree(base_commit) as base_tree:
        for length in args.lengths:
            sides: dict[str, list[float]] = {"base": [], "new": []}
            loads: list[float] = []
            for round_ in range(args.rounds):
                for side, tree in (("base", base_tree), ("new", REPO)):
                    loads.append(load_average())
                    compiled = args.compile and side == "new"
                    sides[side].append(
                        measure(tree, args.threads, length, args.updates, precision[side], compile_model=compiled)
                    )
                    print(f"L={length} round {round_ + 1} {side}: {sides[side][-1]:.2f} updates/s (load {loads[-1]:.2f})")
            ratios = [new / base for base, new in zip(sides["base"], sides["new"])]
            figures[f"speedup_L{length}"] = {
                "value": statistics.median(ratios),
                "unit": "x (median of per-round ratios)",
                "base_median_updates_per_s": statistics.median(sides["base"]),
                "new_median_updates_per_s": statistics.median(sides["new"]),
                "base_runs": [round(v, 3) for v in sides["base"]],
                "new_runs": [round(v, 3) for v in sides["new"]],
                "load_average_range": f"{min(loads):.2f}-{max(loads):.2f}",
            }
            print(f"L={length}: {figures[f'speedup_L{length}']}")
    config = {
        "base": base_commit,
        "threads": args.threads,
        "rounds": args.rounds,
        "updates_per_measurement": args.updates,
        "precision": precision["new"],
        "base_precision": precision["base"],
        "compile_model": args.compile,
    }
    write_results(args.name, config, figures, RESULTS_DIR)


if __name__ == "__main__":
    main()
