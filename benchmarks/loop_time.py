"""Training seconds per 1,000 env steps of a learning-suite run (the task's zoo entry, as
``learning.py`` runs it), sequential and with collection beside training (``overlap_collection``),
or under bf16 autocast (``mixed_precision``) and compiled (``compile_model``; ``--sides``; a compiled
side takes one untimed update first, which compiles it).

With ``--base REV``, a git worktree of that revision is measured too, sequential, with its own
code and zoo entry: how much faster the suite's runs have become. Each measurement runs in a
fresh process: the model is built from the entry, collects its ``learning_starts`` env steps
untimed, then ``learn``s ``--env-steps`` more (collection and updates, no evaluation), timed. The
settings alternate, ``--rounds`` times; the median of each and the
median of the per-round ratios are reported, with the load average beside every figure. Take the
figures on a machine doing nothing else: a process whose threads outnumber its fair share of a busy
machine's cores takes more of them, which would flatter the overlapped side.

    python benchmarks/loop_time.py --task RepeatPreviousEasy --threads 1 --rounds 3
    python benchmarks/loop_time.py --task PositionOnlyCartPoleEasy --env-steps 2000 --rounds 3
    python benchmarks/loop_time.py --device cuda --threads 4          # the update on a GPU
    python benchmarks/loop_time.py --base b580c91                      # also an older version, sequential
    python benchmarks/loop_time.py --sides sequential bf16 --base b580c91   # bf16 against fp32, and the base
    python benchmarks/loop_time.py --sides sequential compiled bf16 bf16_compiled --base b580c91

Results: ``benchmarks/results/loop_time_<task>.json`` / ``.md``.
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm

HERE = Path(__file__).resolve().parent
#: One measurement, run in a fresh process whose working folder is the measured tree's benchmarks
#: (so ``learning`` is that tree's); this folder comes after it on the path, for ``loop_time``.
MEASURE = """
import json, sys
sys.path.append(sys.argv[1])
from loop_time import seconds_per_1000
print(*seconds_per_1000(**json.loads(sys.argv[2])))
"""
#: What each measured setting adds to the entry's arguments (a base gets none: it may predate them).
SIDE_KWARGS: dict[str, dict[str, Any]] = {
    "sequential": {},
    "overlap": {"overlap_collection": True},
    "bf16": {"mixed_precision": True},
    "compiled": {"compile_model": True},
    "bf16_compiled": {"mixed_precision": True, "compile_model": True},
}


def seconds_per_1000(
    task: str, env_steps: int, extra_kwargs: dict[str, Any], threads: int, seed: int, device: str
) -> tuple[float, float]:
    """Training seconds per 1,000 env steps of ``task``'s AMAGO entry (``learning.py``'s, from the
    ``learning`` module on the path) with ``extra_kwargs`` added, measured in this process, and the
    share of them spent in ``train`` calls (sequential: the update rounds, the rest being
    collection; overlapped: finishing and starting rounds)."""
    import torch as th
    from learning import TASKS, make_envs, run_settings

    th.set_num_threads(threads)
    entry = TASKS[task]
    settings = run_settings(entry, "amago", entry.budget)
    env = make_envs(entry, settings, settings.n_envs, seed, training=True)
    model = settings.algo_class(env=env, seed=seed, device=device, verbose=0, **settings.kwargs, **extra_kwargs)
    model.learn(model.learning_starts)  # no update yet: the replay's first rollouts
    if extra_kwargs.get("compile_model"):
        model.train(gradient_steps=1, batch_size=model.batch_size)  # compiles the update, untimed
    elapsed, train_share = timed_learn(model, env_steps)
    env.close()
    return 1000.0 * elapsed / env_steps, train_share


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


def measure(tree: Path, extra_kwargs: dict[str, Any], args: argparse.Namespace) -> tuple[float, float]:
    """:func:`seconds_per_1000` of the package in ``tree``, in a fresh process."""
    settings = {"task": args.task, "env_steps": args.env_steps, "extra_kwargs": extra_kwargs}
    settings.update(threads=args.threads, seed=args.seed, device=args.device)
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, str(HERE), json.dumps(settings)],
        cwd=tree / "benchmarks",
        env={**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(args.threads)},
        capture_output=True,
        text=True,
        check=True,
    )
    seconds, train_share = out.stdout.strip().splitlines()[-1].split()
    return float(seconds), float(train_share)


def main() -> None:
    from common import RESULTS_DIR, git_worktree, short_commit, write_results

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="RepeatPreviousEasy", help="a task of learning.py")
    parser.add_argument("--env-steps", type=int, default=3000, help="timed env steps per measurement")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each measured process")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="torch device of the model (the envs step on the CPU)")
    parser.add_argument("--sides", nargs="+", choices=list(SIDE_KWARGS), default=["sequential", "overlap"])
    parser.add_argument("--base", help="also measure this git revision, sequential (its code and its zoo entry)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    import torch as th

    th.set_num_threads(args.threads)  # as the measured processes: the results name this count
    runs: dict[str, list[float]] = {}
    train_shares: dict[str, list[float]] = {}
    loads: list[float] = []
    with contextlib.ExitStack() as stack:
        sides = {name: (HERE.parent, SIDE_KWARGS[name]) for name in args.sides}
        if args.base:
            sides = {"base": (stack.enter_context(git_worktree(args.base)), {}), **sides}
        for round_ in range(args.rounds):
            for name, (tree, extra_kwargs) in sides.items():
                loads.append(os.getloadavg()[0])
                seconds, train_share = measure(tree, extra_kwargs, args)
                runs.setdefault(name, []).append(seconds)
                train_shares.setdefault(name, []).append(train_share)
                print(
                    f"round {round_ + 1} {name}: {seconds:.2f} s per 1,000 env steps, {train_share:.1%} in train "
                    f"(load {loads[-1]:.2f})",
                    flush=True,
                )
    figures: dict[str, dict[str, Any]] = {
        f"{name}_s_per_1000_env_steps": {
            "value": statistics.median(values),
            "unit": "training s per 1,000 env steps (median)",
            "runs": [round(v, 3) for v in values],
            "share_in_train_calls": statistics.median(train_shares[name]),
        }
        for name, values in runs.items()
    }
    others = [name for name in SIDE_KWARGS if name != "sequential"]
    pairs = [
        *((f"{name}_speedup", "sequential", name) for name in others),
        ("speedup_over_base", "base", "sequential"),
        *((f"{name}_speedup_over_base", "base", name) for name in others),
    ]
    for figure, slow, fast in pairs:
        if slow in runs and fast in runs:
            figures[figure] = {
                "value": statistics.median(s / f for s, f in zip(runs[slow], runs[fast])),
                "unit": f"x (median of per-round {slow} / {fast})",
                "load_average_range": f"{min(loads):.2f}-{max(loads):.2f}",
            }
    config = {
        "task": args.task,
        "env_steps": args.env_steps,
        "threads": args.threads,
        "rounds": args.rounds,
        "seed": args.seed,
        "device": args.device,
        "base": short_commit(args.base) if args.base else None,
        "sides": args.sides,
    }
    write_results(f"loop_time_{args.task}", config, figures, args.out_dir)


if __name__ == "__main__":
    main()
