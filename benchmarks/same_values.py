"""Whether the working tree's updates compute the same values as another revision's, bit for bit.

A change made for speed alone (a fused operator, another layout, an operator kept out of the
compiler's graph) should leave every parameter as it was; where it does, it needs no learning run.
Each side runs ``bench_updates.parameters_after_updates`` in a fresh process on one thread (so no
thread split changes the order of a sum): the reference model of the working tree's benchmarks,
seeded, with its replay filled, warmed up and updated ``--updates`` more times, on the package of
that side (a git worktree of ``--base``, or the working tree). The two states are compared tensor
by tensor; any difference is listed with its largest absolute value.

The reference model is the working tree's, so ``--base`` must accept its arguments (a recent
revision: the check is for a change against its parent, not for distant versions).
``scripts/fingerprint.py`` covers the package's features on tiny eager models (every action space,
relabeling, saving and resuming); this covers the update that the speed benchmarks time, at their
sizes and window lengths (the flash-attention path above 129 steps) and compiled, where the CPU's
opaque operators live.

    python benchmarks/same_values.py --base HEAD                # uncommitted changes
    python benchmarks/same_values.py --base HEAD~1 --compile    # the last commit, compiled updates
    python benchmarks/same_values.py --base HEAD --lengths 64 256 --updates 6

Results: ``benchmarks/results/same_values.json`` / ``.md`` (``--name`` changes the file name).
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch as th
from common import REPO, git_worktree, short_commit, write_results

BENCHMARKS = Path(__file__).resolve().parent

WORKER = """
import sys, torch as th
th.set_num_threads(1)
from bench_updates import parameters_after_updates
th.save(parameters_after_updates(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"), sys.argv[4])
"""


def side_parameters(tree: Path, length: int, updates: int, compile_model: bool, out: Path) -> dict[str, th.Tensor]:
    """``parameters_after_updates`` with the package of ``tree`` (the working tree's benchmarks),
    run in a fresh process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(BENCHMARKS)])}
    run = subprocess.run(
        [sys.executable, "-c", WORKER, str(length), str(updates), str(int(compile_model)), str(out)],
        cwd=BENCHMARKS,
        env=env,
        capture_output=True,
        text=True,
        check=False,  # its error output goes into the error raised below
    )
    if run.returncode != 0:
        raise RuntimeError(
            f"The reference model failed on the package in {tree} (a revision too old for the working tree's "
            f"benchmarks? compare against a recent one):\n{run.stderr[-2000:]}"
        )
    return th.load(out)


def differences(base: dict[str, th.Tensor], new: dict[str, th.Tensor]) -> dict[str, float | None]:
    """The tensors that differ between two states, with their largest absolute difference (None
    where only one state has the tensor, or their shapes differ)."""
    diffs: dict[str, float | None] = {}
    for name in sorted(base.keys() | new.keys()):
        a, b = base.get(name), new.get(name)
        if a is None or b is None or a.shape != b.shape:
            diffs[name] = None
        elif not th.equal(a, b):
            diffs[name] = (a.double() - b.double()).abs().max().item()
    return diffs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="git revision to compare the working tree against")
    parser.add_argument("--lengths", type=int, nargs="+", default=[64])
    parser.add_argument("--updates", type=int, default=6, help="updates after the reference model's warm-up")
    parser.add_argument("--compile", action="store_true", help="both sides with compile_model=True")
    parser.add_argument("--name", default="same_values")
    args = parser.parse_args()
    th.set_num_threads(1)  # the sides' processes run on one thread; the record says so

    figures: dict[str, dict[str, Any]] = {}
    with git_worktree(args.base) as base_tree, tempfile.TemporaryDirectory() as tmp:
        for length in args.lengths:
            states = [
                side_parameters(tree, length, args.updates, args.compile, Path(tmp) / f"{side}_{length}.pt")
                for side, tree in (("base", base_tree), ("new", REPO))
            ]
            diffs = differences(*states)
            figures[f"differing_tensors_L{length}"] = {
                "value": len(diffs),
                "unit": f"of {len(states[1])} tensors of the policy's state",
                "largest_differences": dict(sorted(diffs.items(), key=lambda kv: -(kv[1] or float("inf")))[:10]),
            }
            print(f"L={length}: {len(diffs)} of {len(states[1])} tensors differ", diffs if diffs else "", flush=True)
    config = {"base": short_commit(args.base), **vars(args)}
    write_results(args.name, config, figures)


if __name__ == "__main__":
    main()
