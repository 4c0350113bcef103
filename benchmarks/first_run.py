"""A newcomer's first run: ``AMAGO("TransformerPolicy", env_id).learn(30_000)`` with nothing else set
(one env, every default), on POPGym RepeatPreviousEasy, RepeatFirstEasy and CountRecallEasy.

    python benchmarks/first_run.py                                 # the three tasks, seed 0
    python benchmarks/first_run.py --tasks CountRecallEasy --seeds 1 2
    python benchmarks/first_run.py --report-only

Every 2,500 env steps a run is evaluated on 16 deterministic episodes; it stops at 30,000 env steps
or after two evaluations in a row at a POPGym-normalised score of 0.99. Rows go to
``benchmarks/results/first_run_curves.csv`` (resumable as the ablation record's); the report,
``first_run.md`` / ``.json``, gives per seed the env steps and training seconds (evaluation
excluded) to a normalised score of 0.9 and the best score reached. Target: >= 0.9 within 30k.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import torch as th
from common import add_learning_run_args, provenance, run_metadata
from curves import (
    RETURN_FIELDS,
    CurveStore,
    first_reach,
    markdown_table,
    per_seed,
    return_run,
    train_with_returns,
    write_report,
)

from sb3_amago import AMAGO
from sb3_amago.envs.popgym_envs import POPGYM_RETURN_RANGES, popgym_normalized_score

TASKS = ("RepeatPreviousEasy", "RepeatFirstEasy", "CountRecallEasy")
BUDGET, EVAL_EVERY, TARGET = 30_000, 2_500, 0.9


def return_at_score(task: str, score: float) -> float:
    """The mean return whose POPGym-normalised score is ``score``."""
    low, high = POPGYM_RETURN_RANGES[task]
    return low + score * (high - low)


def report(store: CurveStore, out_dir: Path) -> None:
    """Per task and seed, from its latest attempt (a run stopped before its budget or target is
    marked ``stopped``): steps and seconds to the target, best score, steps run."""
    rows = store.read()
    latest = {return_run(r): r["attempt"] for r in sorted(rows, key=lambda r: r["attempt"])}
    results: dict[str, list[dict]] = {}
    for (task, seed), attempt in sorted(latest.items()):
        run = [r for r in rows if (*return_run(r), r["attempt"]) == (task, seed, attempt)]
        hit = first_reach(run, return_at_score(task, TARGET))
        results.setdefault(task, []).append(
            {
                "seed": seed,
                "steps_to_0.9": None if hit is None else hit["env_steps"],
                "seconds_to_0.9": None if hit is None else hit["wall_s"],
                "best_score": max(popgym_normalized_score(task, r["mean_return"]) for r in run),
                "steps_run": max(r["env_steps"] for r in run),
                "stopped": not any(r["final"] for r in run),
            }
        )
    meta = run_metadata()
    table = [
        (
            task,
            per_seed("-" if r["steps_to_0.9"] is None else f"{r['steps_to_0.9']:,} ({r['seconds_to_0.9']:.0f})" for r in runs),
            per_seed(f"{r['best_score']:.3f}" for r in runs),
            per_seed(f"{r['steps_run']:,}" + (" (stopped)" if r["stopped"] else "") for r in runs),
        )
        for task, runs in results.items()
    ]
    lines = [
        "# First run: every default, one env",
        "",
        provenance(meta, " per run"),
        "",
        (
            '`AMAGO("TransformerPolicy", env_id, seed=seed)` on one env; per seed: env steps (training seconds, '
            "evaluation excluded) to a POPGym-normalised score of 0.9 (`-`: not within the steps run), best score. "
            "Runs made by `python benchmarks/first_run.py` (several runs sharing the 2 cores, so seconds are upper "
            "bounds); the table is rebuilt from the CSV by the command above. `(stopped)`: the run was stopped before "
            "its budget or its target."
        ),
        "",
        markdown_table(("task", "steps (s) to 0.9", "best score", "steps run"), table),
    ]
    write_report(out_dir, "first_run", {"budget": BUDGET, "target": TARGET, "results": results, **meta}, lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    add_learning_run_args(parser)
    args = parser.parse_args(argv)
    th.set_num_threads(args.threads)
    store = CurveStore(args.out_dir / "first_run_curves.csv", RETURN_FIELDS)
    if not args.report_only:
        for task in args.tasks:
            for seed in args.seeds:
                if (task, seed) in store.finished(return_run):
                    continue
                env_id = f"amago-popgym-{task}-v0"
                model = AMAGO("TransformerPolicy", env_id, seed=seed)
                train_with_returns(
                    model, task, seed, EVAL_EVERY, BUDGET, store, env_id, stop_return=return_at_score(task, 0.99)
                )
    report(store, args.out_dir)


if __name__ == "__main__":
    sys.exit(main())
