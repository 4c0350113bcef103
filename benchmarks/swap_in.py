"""Swap-in benchmark: AMAGO with its RL Zoo entries in place of DQN on CartPole-v1 and SAC on
Pendulum-v1, at the zoo's budgets for those peers, seeds side by side.

    python benchmarks/swap_in.py                                   # both tasks, AMAGO and the peer, seeds 0 1 2
    python benchmarks/swap_in.py --tasks CartPole --algos amago --seeds 0
    python benchmarks/swap_in.py --report-only

Each algorithm takes its own entry: AMAGO ``sb3_amago/hyperparams/amago.yml``, the peers RL Zoo's
published ``dqn.yml`` / ``sac.yml`` (read from the installed rl_zoo3). Every ``--eval-every`` env
steps a run is evaluated on 10 deterministic episodes; it stops at the budget. Runs are sequential
in one process (``--threads`` torch threads, 1 by default); rows go to
``benchmarks/results/swap_in_curves.csv`` as they happen (finished runs are skipped on a restart)
and the report, ``swap_in.md`` / ``.json``, gives per seed the env steps and training seconds
(evaluation excluded) to the solved return (CartPole 475, Pendulum -200) and the final return.
"""

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch as th
from common import add_learning_run_args, git_commit, provenance, run_metadata
from curves import EVAL_SEED_OFFSET, EvalRecorder, first_reach, markdown_table, per_seed, write_report
from learning import RunKey, RunSettings, Task, algo_label, curve_store, evaluate_model, make_envs, run_key, run_settings

from sb3_amago.zoo import HYPERPARAMS_FILE


@dataclass(frozen=True)
class SwapInTask(Task):
    """A classic-control task scored by its raw mean return, solved at ``solved``."""

    solved: float = 0.0


TASKS = {
    "CartPole": SwapInTask("CartPole", "CartPole-v1", 50_000, "return", solved=475.0),
    "Pendulum": SwapInTask("Pendulum", "Pendulum-v1", 20_000, "return", continuous=True, solved=-200.0),
}
ALGOS = ("amago", "memoryless")
EVAL_EPISODES = 10


def build_model(key: RunKey, conf_file: Path) -> tuple[Any, RunSettings]:
    """The algorithm of ``key`` at its entry (AMAGO's read from ``conf_file``), on its seeded training envs."""
    task = TASKS[key.task]
    settings = run_settings(task, key.algo, key.budget, conf_file)
    env = make_envs(task, settings, settings.n_envs, key.seed, training=True)
    return settings.algo_class(env=env, seed=key.seed, device="cpu", verbose=0, **settings.kwargs), settings


def train_run(key: RunKey, eval_every: int, csv_path: Path, conf_file: Path) -> None:
    task = TASKS[key.task]
    model, settings = build_model(key, conf_file)
    env = model.get_env()
    eval_env = make_envs(task, settings, 5, key.seed + EVAL_SEED_OFFSET, training=False)
    store = curve_store(csv_path)

    def evaluate() -> dict[str, Any]:
        return evaluate_model(model, eval_env, task, EVAL_EPISODES)._asdict()

    def on_row(row: dict) -> None:
        store.append(row)
        print(
            f"{key.task} {key.algo} seed {key.seed}: {row['env_steps']:>7,} steps  return {row['mean_return']:8.1f}  {row['wall_s']:6.0f} s",
            flush=True,
        )

    run_fields = {**key._asdict(), "commit": git_commit()}
    model.learn(key.budget, callback=EvalRecorder(evaluate, eval_every, key.budget, run_fields, on_row))
    env.close()
    eval_env.close()


def summarize(rows: Sequence[dict]) -> dict[str, dict]:
    """Per (task, algo): per-seed steps / seconds to the solved return and the last return (of a
    run stopped before its budget too, marked ``stopped``)."""
    out: dict[str, dict] = {}
    finished = {(r["task"], r["algo"], r["seed"]) for r in rows if r["final"]}
    for task_name, algo, seed in sorted({(r["task"], r["algo"], r["seed"]) for r in rows}):
        task = TASKS[task_name]
        run = sorted(
            (r for r in rows if (r["task"], r["algo"], r["seed"]) == (task_name, algo, seed)), key=lambda r: r["env_steps"]
        )
        hit = first_reach(run, task.solved)
        entry = out.setdefault(f"{task_name} / {algo_label(algo, task)}", {"solved_return": task.solved, "seeds": []})
        entry["seeds"].append(
            {
                "seed": seed,
                "steps_to_solved": None if hit is None else hit["env_steps"],
                "seconds_to_solved": None if hit is None else round(hit["wall_s"], 1),
                "final_return": run[-1]["mean_return"],
                "final_steps": run[-1]["env_steps"],
                "train_seconds": round(run[-1]["wall_s"], 1),
                "stopped": (task_name, algo, seed) not in finished,
            }
        )
    return out


def markdown(summary: dict[str, dict], meta: dict) -> list[str]:
    table = []
    for name, entry in summary.items():
        seeds = entry["seeds"]
        reach = per_seed(
            "-" if s["steps_to_solved"] is None else f"{s['steps_to_solved']:,} ({s['seconds_to_solved']:.0f})" for s in seeds
        )
        final = per_seed(
            f"{s['final_return']:.1f}" + (f" (stopped at {s['final_steps']:,})" if s["stopped"] else "") for s in seeds
        )
        table.append((name, f"{entry['solved_return']:g}", reach, final, per_seed(f"{s['train_seconds']:.0f}" for s in seeds)))
    return [
        "# Swap-in: AMAGO in place of DQN / SAC",
        "",
        provenance(meta, " per run"),
        "",
        (
            "Per seed: env steps (training seconds, evaluation excluded) to the first evaluation at the solved "
            "return, `-` if never; final return of 10 deterministic episodes (or the last one, where a run was "
            "stopped before its budget); total training seconds. Runs made by `python benchmarks/swap_in.py "
            "[--tasks T --algos A --seeds S]`, several sharing the 2 cores (seconds are upper bounds)."
        ),
        "",
        markdown_table(("task / algorithm", "solved at", "steps (s) to solved", "final return", "training s"), table),
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--algos", nargs="+", default=list(ALGOS), choices=list(ALGOS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--eval-every", type=int, default=2_500)
    add_learning_run_args(parser)
    parser.add_argument("--conf-file", type=Path, default=HYPERPARAMS_FILE, help="AMAGO's hyperparameter file")
    args = parser.parse_args(argv)
    th.set_num_threads(args.threads)
    csv_path = args.out_dir / "swap_in_curves.csv"
    if not args.report_only:
        planned = [
            RunKey(name, algo, seed, TASKS[name].budget) for name in args.tasks for algo in args.algos for seed in args.seeds
        ]
        finished = curve_store(csv_path).drop_unfinished(run_key, only=planned)
        for key in planned:
            if key not in finished:
                train_run(key, args.eval_every, csv_path, args.conf_file)
    summary = summarize(curve_store(csv_path).read())
    meta = run_metadata()
    payload = {"tasks": {k: vars(v) for k, v in TASKS.items()}, "results": summary, **meta}
    write_report(args.out_dir, "swap_in", payload, markdown(summary, meta))


if __name__ == "__main__":
    sys.exit(main())
