"""Milliseconds per update of AMAGO's swap-in zoo entry read from several hyperparameter files,
measured side by side in one process.

Each file's entry for the task (``swap_in.py``'s CartPole-v1 or Pendulum-v1) builds a model on its
own seeded envs, collects ``learning_starts`` plus 1,000 env steps with that entry's settings, and
takes a few warm-up updates. Then the models' ``train`` calls alternate, ``--updates`` updates each,
``--rounds`` times: every entry sees the same machine state, so their ratio holds on a busy machine
where the absolute figures do not. Reported per file: the median milliseconds per update and, for
each file after the first, the first's median over its own (its speed-up); and, since entries may
differ in how many updates they take per env step, the update seconds per 1,000 env steps (the
median times the entry's updates per env step) and the speed-up in those terms.

    git show f5f50f8:sb3_amago/hyperparams/amago.yml > /tmp/before.yml
    python benchmarks/entry_updates.py --task CartPole --conf-files /tmp/before.yml sb3_amago/hyperparams/amago.yml

Results: ``benchmarks/results/entry_updates_<task>.json`` / ``.md``.
"""

import argparse
import os
import statistics
import time
from pathlib import Path

import torch as th
from common import write_results
from learning import RunKey
from stable_baselines3.common.type_aliases import TrainFrequencyUnit
from swap_in import TASKS, build_model

from sb3_amago import AMAGO


def entry_model(task: str, conf_file: Path, seed: int) -> AMAGO:
    """AMAGO at ``conf_file``'s entry for ``task``, its replay filled past ``learning_starts``."""
    model, _ = build_model(RunKey(task, "amago", seed, TASKS[task].budget), conf_file)
    model.learn(model.learning_starts + 1_000)
    model.train(gradient_steps=5, batch_size=model.batch_size)
    return model


def updates_per_env_step(model: AMAGO) -> float:
    """Updates ``model.learn`` takes per env step: ``gradient_steps`` per ``train_freq`` steps of all envs."""
    if model.train_freq.unit != TrainFrequencyUnit.STEP or model.gradient_steps < 0:
        raise ValueError(
            f"updates per env step are only fixed for train_freq in steps and gradient_steps >= 0, not "
            f"train_freq={model.train_freq}, gradient_steps={model.gradient_steps}: give the entry both"
        )
    return model.gradient_steps / (model.train_freq.frequency * model.n_envs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="CartPole")
    parser.add_argument(
        "--conf-files", type=Path, nargs="+", required=True, help="AMAGO hyperparameter files, first = baseline"
    )
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--updates", type=int, default=40, help="updates per entry per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    th.set_num_threads(args.threads)

    models = {str(path): entry_model(args.task, path, args.seed) for path in args.conf_files}
    load_before = os.getloadavg()[0]
    ms: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            start = time.perf_counter()
            model.train(gradient_steps=args.updates, batch_size=model.batch_size)
            ms[name].append((time.perf_counter() - start) / args.updates * 1e3)
    load = f"{load_before:.2f} -> {os.getloadavg()[0]:.2f}"  # 1-minute load average around the timed rounds
    baseline = statistics.median(ms[str(args.conf_files[0])])
    per_env_step = {name: updates_per_env_step(model) for name, model in models.items()}
    baseline_s = baseline * per_env_step[str(args.conf_files[0])]  # ms per env step = s per 1,000
    figures = {}
    for i, (name, values) in enumerate(ms.items()):
        median = statistics.median(values)
        seconds = median * per_env_step[name]
        figures[f"ms_per_update_{i}"] = {
            "value": median,
            "unit": "ms per update (median)",
            "conf_file": name,
            "speedup_vs_0": baseline / median,
            "updates_per_env_step": per_env_step[name],
            "update_s_per_1000_env_steps": round(seconds, 2),
            "env_step_speedup_vs_0": baseline_s / seconds,
            "rounds": [round(v, 2) for v in values],
            "load_average": load,
        }
        print(
            f"{name}: {median:.1f} ms per update, {baseline / median:.2f}x the first; "
            f"{seconds:.1f} update s per 1,000 env steps, {baseline_s / seconds:.2f}x the first",
            flush=True,
        )
    config = {**vars(args), "conf_files": [str(p) for p in args.conf_files]}
    write_results(f"entry_updates_{args.task}", config, figures)


if __name__ == "__main__":
    main()
