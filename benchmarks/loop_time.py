"""Training seconds per 1,000 env steps of a learning-suite run (the task's zoo entry, as
``learning.py`` runs it), sequential and with collection beside training (``overlap_collection``).

Each measurement runs in a fresh process: the model is built from the entry, collects its
``learning_starts`` env steps untimed, then ``learn``s ``--env-steps`` more (collection and updates,
no evaluation), timed. The two settings alternate, ``--rounds`` times; the median of each and the
median of the per-round ratios are reported, with the load average beside every figure. Take the
figures on a machine doing nothing else: a process whose threads outnumber its fair share of a busy
machine's cores takes more of them, which would flatter the overlapped side.

    python benchmarks/loop_time.py --task RepeatPreviousEasy --threads 1 --rounds 3
    python benchmarks/loop_time.py --task PositionOnlyCartPoleEasy --env-steps 2000 --rounds 3
    python benchmarks/loop_time.py --device cuda --threads 4          # the update on a GPU

Results: ``benchmarks/results/loop_time_<task>.json`` / ``.md``.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch as th
from common import RESULTS_DIR, write_results

if TYPE_CHECKING:
    from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

SETTINGS = {"sequential": False, "overlap": True}


def seconds_per_1000(args: argparse.Namespace, overlap: bool) -> tuple[float, float]:
    """Training seconds per 1,000 env steps of ``task_name``'s AMAGO entry, measured in this
    process, and the share of them spent in ``train`` calls (sequential: the update rounds, the
    rest being collection; overlapped: starting and finishing rounds)."""
    from learning import TASKS, make_envs, run_settings

    th.set_num_threads(args.threads)
    task, seed = TASKS[args.task], args.seed
    settings = run_settings(task, "amago", task.budget)
    env = make_envs(task, settings, settings.n_envs, seed, training=True)
    kwargs = {**settings.kwargs, "overlap_collection": overlap}
    model = settings.algo_class(env=env, seed=seed, device=args.device, verbose=0, **kwargs)
    model.learn(model.learning_starts)  # no update yet: the replay's first rollouts
    elapsed, train_share = timed_learn(model, args.env_steps)
    env.close()
    return 1000.0 * elapsed / args.env_steps, train_share


def timed_learn(model: "OffPolicyAlgorithm", env_steps: int) -> tuple[float, float]:
    """Seconds that ``model.learn(env_steps)`` takes (continuing the model's count), and the share
    of them spent inside its ``train`` calls."""
    in_train = 0.0
    train = model.train
    own = vars(model).get("train")  # a train set on the model itself, to put back

    def timed_train(*args: Any, **kwargs: Any) -> None:
        nonlocal in_train
        began = time.perf_counter()
        train(*args, **kwargs)
        in_train += time.perf_counter() - began

    model.train = timed_train  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        model.learn(env_steps, reset_num_timesteps=False)
        elapsed = time.perf_counter() - start
    finally:
        if own is None:
            del model.train  # the class's method again
        else:
            model.train = own  # type: ignore[method-assign]
    return elapsed, in_train / elapsed


def measure(args: argparse.Namespace, setting: str) -> tuple[float, float]:
    """:func:`seconds_per_1000` in a fresh process."""
    out = subprocess.run(
        [sys.executable, __file__, "--measure", setting, "--task", args.task, "--env-steps", str(args.env_steps)]
        + ["--threads", str(args.threads), "--seed", str(args.seed), "--device", args.device],
        cwd=Path(__file__).parent,
        env={**os.environ, "OMP_NUM_THREADS": str(args.threads)},
        capture_output=True,
        text=True,
        check=True,
    )
    seconds, train_share = out.stdout.strip().splitlines()[-1].split()
    return float(seconds), float(train_share)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="RepeatPreviousEasy", help="a task of learning.py")
    parser.add_argument("--env-steps", type=int, default=3000, help="timed env steps per measurement")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each measured process")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="torch device of the model (the envs step on the CPU)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--measure", choices=SETTINGS, help=argparse.SUPPRESS)  # one measurement, in this process
    args = parser.parse_args()
    if args.measure:
        print(*seconds_per_1000(args, SETTINGS[args.measure]))
        return
    th.set_num_threads(args.threads)  # as the measured processes: the results name this count
    runs: dict[str, list[float]] = {name: [] for name in SETTINGS}
    train_shares: dict[str, list[float]] = {name: [] for name in SETTINGS}
    loads: list[float] = []
    for round_ in range(args.rounds):
        for name in SETTINGS:
            loads.append(os.getloadavg()[0])
            seconds, train_share = measure(args, name)
            runs[name].append(seconds)
            train_shares[name].append(train_share)
            print(
                f"round {round_ + 1} {name}: {seconds:.2f} s per 1,000 env steps, {train_share:.1%} in train "
                f"(load {loads[-1]:.2f})",
                flush=True,
            )
    ratios = [seq / over for seq, over in zip(runs["sequential"], runs["overlap"])]
    figures = {
        f"{name}_s_per_1000_env_steps": {
            "value": statistics.median(values),
            "unit": "training s per 1,000 env steps (median)",
            "runs": [round(v, 3) for v in values],
            "share_in_train_calls": statistics.median(train_shares[name]),
        }
        for name, values in runs.items()
    }
    figures["overlap_speedup"] = {
        "value": statistics.median(ratios),
        "unit": "x (median of per-round sequential / overlap)",
        "load_average_range": f"{min(loads):.2f}-{max(loads):.2f}",
    }
    config = {
        "task": args.task,
        "env_steps": args.env_steps,
        "threads": args.threads,
        "rounds": args.rounds,
        "seed": args.seed,
        "device": args.device,
    }
    write_results(f"loop_time_{args.task}", config, figures, args.out_dir)


if __name__ == "__main__":
    main()
