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
    python benchmarks/compare_commits.py --base b580c91 --compile --bound   # and the most it could gain
    python benchmarks/compare_commits.py --base HEAD --compile --compile-base   # both sides compiled

``--bound`` adds, per window length, the working tree's own floor measured after the rounds in one
more fresh process (``bench_updates.roofline`` at its precision and compile setting): its matrix
products (attention kernels included) replayed one by one at the update's shapes, each at its best
on operands in the caches (``bench_updates.replay_seconds``), plus its overhead floor
(the same update at width 8). The base's median update time over that sum is the speedup the working
tree could reach with every other operator of its update free (elementwise work, norms, masks, the
loss's small tensors): a ratio above it needs fewer FLOPs, a faster matrix rate (another precision)
or a smaller fixed cost per update, not faster elementwise code.

Results: ``benchmarks/results/compare_commits.json`` / ``.md`` (``--name`` changes the file name).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import REPO, RESULTS_DIR, git_worktree, short_commit, write_results

MEASURE = """
import sys, torch as th
th.set_num_threads(int(sys.argv[1]))
from bench_updates import updates_per_second
print(updates_per_second(int(sys.argv[2]), int(sys.argv[3]), mixed_precision=sys.argv[4] == "bf16", compile_model=sys.argv[5] == "1"))
"""

BOUND = """
import json, sys, torch as th
th.set_num_threads(int(sys.argv[1]))
from bench_updates import roofline
print(json.dumps(roofline(int(sys.argv[2]), int(sys.argv[3]), mixed_precision=sys.argv[4] == "bf16", compile_model=sys.argv[5] == "1")))
"""


def run_script(
    script: str,
    tree: Path,
    threads: int,
    length: int,
    updates: int,
    precision: str = "fp32",
    extra_env: dict[str, str] | None = None,
    compile_model: bool = False,
) -> str:
    """The last line ``script`` prints for the package in ``tree``, run in a fresh process that
    imports it from there with the arguments ``threads length updates precision compile_model``
    (``precision`` ``"bf16"``: under bf16 autocast; ``extra_env``: more environment variables;
    ``compile_model``: the update's forward compiled)."""
    env = {**os.environ, "PYTHONPATH": str(tree), **(extra_env or {})}
    out = subprocess.run(
        [sys.executable, "-c", script, str(threads), str(length), str(updates), precision, str(int(compile_model))],
        cwd=tree / "benchmarks",
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip().splitlines()[-1]


def measure(
    tree: Path,
    threads: int,
    length: int,
    updates: int,
    precision: str = "fp32",
    extra_env: dict[str, str] | None = None,
    compile_model: bool = False,
) -> float:
    """Updates/s of the package in ``tree``, in a fresh process (see :func:`run_script`)."""
    return float(run_script(MEASURE, tree, threads, length, updates, precision, extra_env, compile_model))


def bound(args: argparse.Namespace, length: int, precision: str, base_updates_per_s: float) -> dict[str, Any]:
    """The ``--bound`` figure at ``length``: the base's median update time over the working tree's
    matrix replay plus overhead floor, measured now in a fresh process."""
    load = load_average()
    floor = json.loads(run_script(BOUND, REPO, args.threads, length, args.updates, precision, compile_model=args.compile))
    base_ms = 1e3 / base_updates_per_s
    return {
        "value": base_ms / (floor["matrix_ms"] + floor["overhead_floor_ms"]),
        "unit": "x (base's median update time over the new side's matrix replay + overhead floor)",
        "base_median_update_ms": round(base_ms, 2),
        "matrix_ms": round(floor["matrix_ms"], 2),
        "overhead_floor_ms": round(floor["overhead_floor_ms"], 2),
        "new_update_ms_same_process": round(floor["update_ms"], 2),
        "gflop_per_update": round(floor["gflop_per_update"], 3),
        "load_average": round(load, 2),
    }


def load_average() -> float:
    return os.getloadavg()[0]


@dataclass
class Rounds:
    """Updates/s of each setting in round order, and the 1-minute load average read before each
    measurement."""

    runs: dict[str, list[float]]
    loads: list[float]

    def median(self, name: str) -> float:
        return statistics.median(self.runs[name])

    def ratios(self, name: str, reference: str) -> list[float]:
        """``name``'s rate over ``reference``'s, round by round."""
        return [run / ref for run, ref in zip(self.runs[name], self.runs[reference])]

    @property
    def load_range(self) -> str:
        return f"{min(self.loads):.2f}-{max(self.loads):.2f}"


def measure_rounds(
    settings: dict[str, dict[str, Any]],
    threads: int,
    length: int,
    updates: int,
    rounds: int,
    alternate: bool = False,
    label: str = "",
) -> Rounds:
    """Updates/s under each of ``settings`` (name -> keyword arguments of :func:`measure` besides
    ``threads``, ``length`` and ``updates``; ``tree`` is the working tree unless given): one fresh
    process per setting per round, the settings in their order, or with ``alternate`` reversed every
    other round."""
    result = Rounds({name: [] for name in settings}, [])
    for round_ in range(rounds):
        order = list(settings)[:: -1 if alternate and round_ % 2 else 1]
        for name in order:
            kwargs = dict(settings[name])
            tree = kwargs.pop("tree", REPO)
            result.loads.append(load_average())
            result.runs[name].append(measure(tree, threads, length, updates, **kwargs))
            rate, load = result.runs[name][-1], result.loads[-1]
            print(f"{label}round {round_ + 1} {name}: {rate:.2f} updates/s (load {load:.2f})", flush=True)
    return result


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
    parser.add_argument(
        "--compile-base", action="store_true", help="the base with compile_model=True too (a base that has the option)"
    )
    parser.add_argument(
        "--bound", action="store_true", help="also the working tree's matrix replay + overhead floor (see the docstring)"
    )
    parser.add_argument("--name", default="compare_commits")
    args = parser.parse_args()
    base_commit = short_commit(args.base)
    precision = {"base": args.base_precision or args.precision, "new": args.precision}
    figures: dict[str, dict] = {}
    with git_worktree(base_commit) as base_tree:
        settings = {
            "base": {"tree": base_tree, "precision": precision["base"], "compile_model": args.compile_base},
            "new": {"precision": precision["new"], "compile_model": args.compile},
        }
        for length in args.lengths:
            sides = measure_rounds(settings, args.threads, length, args.updates, args.rounds, label=f"L={length} ")
            figures[f"speedup_L{length}"] = {
                "value": statistics.median(sides.ratios("new", "base")),
                "unit": "x (median of per-round ratios)",
                "base_median_updates_per_s": sides.median("base"),
                "new_median_updates_per_s": sides.median("new"),
                "base_runs": [round(v, 3) for v in sides.runs["base"]],
                "new_runs": [round(v, 3) for v in sides.runs["new"]],
                "load_average_range": sides.load_range,
            }
            print(f"L={length}: {figures[f'speedup_L{length}']}")
            if args.bound:
                figures[f"speedup_bound_L{length}"] = bound(args, length, precision["new"], sides.median("base"))
                print(f"L={length} bound: {figures[f'speedup_bound_L{length}']}")
    config = {
        "base": base_commit,
        "threads": args.threads,
        "rounds": args.rounds,
        "updates_per_measurement": args.updates,
        "precision": precision["new"],
        "base_precision": precision["base"],
        "compile_model": args.compile,
        "base_compile_model": args.compile_base,
        "bound": args.bound,
    }
    write_results(args.name, config, figures, RESULTS_DIR)


if __name__ == "__main__":
    main()
