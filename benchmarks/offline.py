"""Learning from data on POPGym RepeatPreviousEasy: offline from datasets of a scripted expert, and
offline-to-online.

    python benchmarks/offline.py                                   # every cell, seeds 0 1 2
    python benchmarks/offline.py --cells expert_amago expert_bc --seeds 0
    python benchmarks/offline.py --report-only                     # table + json from the CSV
    python benchmarks/offline.py --quick --out-dir /tmp/offline    # a tiny smoke run (tests)

The expert (:func:`expert_action`) solves the task exactly (return 1.0): it answers with the suit
seen three observations before the current one. A dataset holds ``--episodes`` episodes (51
steps each), stored through Minari (``create_dataset_from_buffers`` into a temporary
``MINARI_DATASETS_PATH``; the episodes hold the env's own observation, and ``add_dataset`` adds
``prev_reward``): the expert's, with a share of uniformly random episodes (10 % for ``expert``, 50
% for ``mixed``). Cells:

* ``<data>_amago``: AMAGO's loss, ``--updates`` offline updates, zero env steps;
* ``<data>_bc``: the same with ``pure_bc=True`` (every buffer action imitated);
* ``o2o``: ``--o2o-episodes`` expert episodes, stored protected (a quarter of each batch),
  ``--o2o-updates`` offline updates, then online learning (the ablation record's settings,
  ``learning_starts`` one batch) until two evaluations in a row reach 0.99 or ``--budget`` env steps;
* ``scratch``: online from scratch with the same settings (the ablation record's ``defaults`` row
  is the same run on an earlier commit).

The model is the ablation record's (batch 24 windows of 53 steps, Transformer d_model 128 x 3
layers x 8 heads, lr 1e-4, 8 envs online). Evaluation: 16 episodes deterministic (``mean_return``)
and 16 sampled (``sampled_return``), every ``--eval-every`` updates offline and env steps online.

Results: ``benchmarks/results/offline_curves.csv`` (one row per evaluation; resumable: finished
``(cell, seed)`` runs are skipped, unfinished ones restart) and ``offline.md`` / ``.json``.
"""

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch as th
from common import add_learning_run_args, git_commit, provenance, run_metadata
from curves import (
    EVAL_SEED_OFFSET,
    CurveStore,
    EvalRecorder,
    Row,
    consecutive_hits,
    markdown_table,
    per_seed,
    write_report,
)
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_amago import AMAGO

ENV_ID = "amago-popgym-RepeatPreviousEasy-v0"
SOLVED = 0.99
EXPERT_RETURN = 1.0
#: How many observations back the answer lies (RepeatPreviousEasy's k = 4 counts the current card).
LAG = 3
RANDOM_SHARE = {"expert": 0.1, "mixed": 0.5}
CELLS = ("expert_amago", "expert_bc", "mixed_amago", "mixed_bc", "o2o", "scratch")
FIELDS: dict[str, type] = {
    "cell": str,
    "seed": int,
    "attempt": int,
    "commit": str,
    "updates": int,
    "env_steps": int,
    "wall_s": float,
    "mean_return": float,
    "sampled_return": float,
    "final": int,
}
BASE: dict[str, Any] = {"batch_size": 24, "max_seq_len": 52, "learning_rate": 1e-4, "train_freq": 1, "gradient_steps": 1}
ENCODER: dict[str, Any] = {"d_model": 128, "n_heads": 8, "n_layers": 3, "d_ff": 512}
QUICK_ENCODER: dict[str, Any] = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32}
N_ENVS = 8


@dataclass(frozen=True)
class Config:
    cells: tuple[str, ...]
    seeds: tuple[int, ...]
    episodes: int
    updates: int
    o2o_episodes: int
    o2o_updates: int
    budget: int
    eval_every: int
    eval_episodes: int
    threads: int
    out_dir: Path
    report_only: bool
    quick: bool

    @property
    def name(self) -> str:
        return "offline_quick" if self.quick else "offline"


def parse_config(argv: Sequence[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", nargs="+", default=list(CELLS), choices=list(CELLS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--episodes", type=int, default=200, help="episodes of the offline datasets")
    parser.add_argument("--updates", type=int, default=3_000, help="offline updates")
    parser.add_argument("--o2o-episodes", type=int, default=10, help="expert episodes before online learning")
    parser.add_argument("--o2o-updates", type=int, default=1_000, help="offline updates before online learning")
    parser.add_argument("--budget", type=int, default=8_000, help="env steps of the online cells")
    parser.add_argument("--eval-every", type=int, default=500, help="updates (offline) or env steps (online)")
    parser.add_argument("--eval-episodes", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="a tiny model and run, for a smoke test")
    add_learning_run_args(parser)
    args = parser.parse_args(argv)
    names = ("episodes", "updates", "o2o_episodes", "o2o_updates", "budget", "eval_every", "eval_episodes")
    sizes = {name: getattr(args, name) for name in names}
    if args.quick:
        sizes = dict(zip(names, (6, 8, 2, 4, 64, 4, 1)))
    return Config(
        tuple(args.cells), tuple(args.seeds), threads=args.threads, out_dir=args.out_dir, report_only=args.report_only,
        quick=args.quick, **sizes,
    )  # fmt: skip


# ------------------------------------------------------------------------------------------------
# Data
# ------------------------------------------------------------------------------------------------
def expert_action(history: Sequence[int]) -> int:
    """The expert's answer given the observations so far (the current one last)."""
    return int(history[-1 - LAG]) if len(history) > LAG else 0


def record_episodes(n: int, random_share: float, seed: int) -> list[dict[str, np.ndarray]]:
    """``n`` episodes in Minari's layout, the env's own observation (no ``prev_reward``): the expert's,
    and a share ``random_share`` of uniformly random ones (every ``1 / random_share``-th episode)."""
    env = gym.make(ENV_ID)
    rng = np.random.default_rng(seed)
    n_random = round(random_share * n)
    randoms = set(np.linspace(0, n - 1, n_random).round().astype(int).tolist()) if n_random else set()
    episodes = []
    for i in range(n):
        obs, _ = env.reset(seed=seed * 100_000 + i)
        history = [int(obs["observation"])]
        actions, rewards, terms, truncs = [], [], [], []
        while True:
            action = int(rng.integers(4)) if i in randoms else expert_action(history)
            obs, reward, terminated, truncated, _ = env.step(action)
            history.append(int(obs["observation"]))
            actions.append(action)
            rewards.append(float(reward))
            terms.append(terminated)
            truncs.append(truncated)
            if terminated or truncated:
                break
        episodes.append(
            {
                "observations": np.array(history, dtype=np.int64),
                "actions": np.array(actions, dtype=np.int64),
                "rewards": np.array(rewards),
                "terminations": np.array(terms),
                "truncations": np.array(truncs),
            }
        )
    env.close()
    return episodes


def minari_dataset(name: str, episodes: list[dict[str, np.ndarray]]) -> Any:
    """The episodes stored as a local Minari dataset and loaded back (``MINARI_DATASETS_PATH``)."""
    import minari
    from minari.data_collector import EpisodeBuffer

    env = gym.make(ENV_ID)
    buffers = [EpisodeBuffer(id=i, infos={}, **episode) for i, episode in enumerate(episodes)]
    dataset_id = f"sb3amago/{name}-v0"
    if dataset_id in minari.list_local_datasets():
        minari.delete_dataset(dataset_id)
    minari.create_dataset_from_buffers(
        dataset_id,
        buffers,
        env=ENV_ID,
        eval_env=ENV_ID,
        observation_space=env.unwrapped.observation_space,  # the env's own, without prev_reward
        action_space=env.action_space,
        algorithm_name="scripted expert (benchmarks/offline.py)",
        author="sb3-amago benchmarks",
        author_email="none",
        code_permalink="benchmarks/offline.py",
        description="POPGym RepeatPreviousEasy episodes of a scripted expert, some uniformly random",
    )
    return minari.load_dataset(dataset_id)


# ------------------------------------------------------------------------------------------------
# Runs
# ------------------------------------------------------------------------------------------------
def make_model(config: Config, seed: int, n_envs: int, **kwargs: Any) -> AMAGO:
    settings = {**BASE, **kwargs}
    encoder = ENCODER
    policy_kwargs: dict[str, Any] = {}
    if config.quick:
        settings.update(batch_size=4, max_seq_len=8)
        encoder = QUICK_ENCODER
        policy_kwargs = {"d_embed": 16, "actor_hidden": (16,), "critic_hidden": (16,)}
    # Online cells start learning almost at once (one batch of steps; the replay may hold a dataset already).
    settings["learning_starts"] = settings["batch_size"]
    env = make_vec_env(ENV_ID, n_envs=n_envs, seed=seed)
    return AMAGO(
        "TransformerPolicy",
        env,
        seed=seed,
        device="cpu",
        buffer_size=max(100_000, 60 * config.episodes),
        policy_kwargs={**policy_kwargs, "traj_encoder_kwargs": encoder},
        **settings,
    )


def evaluator(model: AMAGO, seed: int, episodes: int) -> Callable[[], dict[str, float]]:
    eval_env = make_vec_env(ENV_ID, n_envs=min(8, episodes), seed=seed + EVAL_SEED_OFFSET)

    def evaluate() -> dict[str, float]:
        scores = {}
        for column, deterministic in (("mean_return", True), ("sampled_return", False)):
            returns, _ = evaluate_policy(model, eval_env, episodes, deterministic=deterministic, return_episode_rewards=True)
            scores[column] = float(np.mean(returns))
        return {**scores, "updates": model._n_updates}

    return evaluate


class OfflineEvaluations(BaseCallback):
    """Evaluates every ``every`` updates of ``learn_offline`` (and at its start and end), handing each row to ``on_row``."""

    def __init__(
        self, evaluate: Callable[[], dict[str, float]], every: int, total: int, fields: Row, on_row: Callable[[Row], None]
    ) -> None:
        super().__init__()
        self.evaluate, self.every, self.total, self.fields, self.on_row = evaluate, every, total, fields, on_row
        self.start = self.eval_seconds = 0.0

    def record(self, final: bool) -> None:
        began = time.perf_counter()
        measured = self.evaluate()
        wall = began - self.start - self.eval_seconds
        self.eval_seconds += time.perf_counter() - began
        self.on_row({**self.fields, "env_steps": self.model.num_timesteps, "wall_s": wall, **measured, "final": int(final)})

    def _on_training_start(self) -> None:
        self.start = time.perf_counter()
        self.record(final=False)

    def _on_step(self) -> bool:
        if self.n_calls % self.every == 0 and self.n_calls < self.total:  # the last one is the final row
            self.record(final=False)
        return True


def run_cell(config: Config, cell: str, seed: int, store: CurveStore) -> None:
    fields = {"cell": cell, "seed": seed, "attempt": int(time.time()), "commit": git_commit()}

    def on_row(row: Row) -> None:
        store.append(row)
        print(
            f"{cell:>13} seed {seed} {row['updates']:>6} updates {row['env_steps']:>6} steps  "
            f"return {row['mean_return']:+.3f} (sampled {row['sampled_return']:+.3f})  {row['wall_s']:6.0f} s",
            flush=True,
        )

    if cell in ("o2o", "scratch"):
        model = make_model(config, seed, N_ENVS, replay_buffer_kwargs={"protected_share": 0.25})
        evaluate = evaluator(model, seed, config.eval_episodes)
        if cell == "o2o":
            model.add_dataset(minari_dataset(f"o2o-{seed}", record_episodes(config.o2o_episodes, 0.0, seed)), protected=True)
            model.learn_offline(config.o2o_updates, log_interval=0)
        recorder = EvalRecorder(
            evaluate, config.eval_every, config.budget, fields, on_row, stop=consecutive_hits("mean_return", SOLVED, 2)
        )
        model.learn(config.budget, callback=recorder)
        return
    data, algo = cell.split("_")
    model = make_model(config, seed, 1, pure_bc=algo == "bc")
    model.add_dataset(minari_dataset(f"{data}-{seed}", record_episodes(config.episodes, RANDOM_SHARE[data], seed)))
    evaluate = evaluator(model, seed, config.eval_episodes)
    evaluations = OfflineEvaluations(evaluate, config.eval_every, config.updates, fields, on_row)
    model.learn_offline(config.updates, callback=evaluations, log_interval=0)
    evaluations.record(final=True)


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------
def summarize(rows: Sequence[Row]) -> dict[str, dict[str, Any]]:
    finished = {(r["cell"], r["seed"], r["attempt"]) for r in rows if r["final"]}
    runs: dict[str, dict[int, list[Row]]] = {}
    for row in rows:
        if (row["cell"], row["seed"], row["attempt"]) in finished:
            runs.setdefault(row["cell"], {}).setdefault(row["seed"], []).append(row)
    out: dict[str, dict[str, Any]] = {}
    for cell in [c for c in CELLS if c in runs]:
        seeds = sorted(runs[cell])
        finals = [max(runs[cell][s], key=lambda r: (r["updates"], r["env_steps"])) for s in seeds]
        entry: dict[str, Any] = {
            "seeds": seeds,
            "final_return": [r["mean_return"] for r in finals],
            "final_sampled_return": [r["sampled_return"] for r in finals],
            "updates": [r["updates"] for r in finals],
            "commits": sorted({r["commit"] for r in finals}),
        }
        if cell in ("o2o", "scratch"):
            solved = []
            for s in seeds:
                ordered = sorted(runs[cell][s], key=lambda r: r["env_steps"])
                hits = [r["env_steps"] for r in ordered if r["mean_return"] >= SOLVED]
                solved.append(hits[0] if hits else None)
            entry["env_steps_to_solved"] = solved
            entry["budget_steps"] = [r["env_steps"] for r in finals]
        out[cell] = entry
    return out


def progress_note(summary: dict[str, dict[str, Any]]) -> str:
    """Which cells and seeds the table holds, and which of the full run's are still missing."""
    done = "; ".join(f"`{cell}` seed(s) {', '.join(map(str, e['seeds']))}" for cell, e in summary.items())
    missing = [cell for cell in CELLS if len(summary.get(cell, {}).get("seeds", [])) < 3]
    return (
        f"Finished runs: {done or 'none'}; cells short of their 3 seeds: "
        f"{', '.join(f'`{c}`' for c in missing) or 'none'}. Made by `python benchmarks/offline.py --cells C --seeds S "
        "--threads 1` with other runs sharing the 2-core machine (seconds are upper bounds); the table is rebuilt "
        "from the CSV by the command below."
    )


def markdown(summary: dict[str, dict[str, Any]], meta: dict[str, Any], config: Config) -> list[str]:
    offline = [
        (
            cell,
            per_seed(f"{v:+.3f}" for v in e["final_return"]),
            per_seed(f"{100 * v / EXPERT_RETURN:.0f} %" for v in e["final_return"]),
            per_seed(f"{v:+.3f}" for v in e["final_sampled_return"]),
            per_seed(e["updates"]),
        )
        for cell, e in summary.items()
        if cell not in ("o2o", "scratch")
    ]
    online = [
        (
            cell,
            per_seed(f"{v:,}" if v is not None else f">{b:,}" for v, b in zip(e["env_steps_to_solved"], e["budget_steps"])),
            per_seed(f"{v:+.3f}" for v in e["final_return"]),
        )
        for cell, e in summary.items()
        if cell in ("o2o", "scratch")
    ]
    lines = [
        "# Learning from data on POPGym RepeatPreviousEasy",
        "",
        (
            f"Datasets of {config.episodes} episodes of a scripted expert (return {EXPERT_RETURN:g}) with "
            f"{RANDOM_SHARE['expert']:.0%} (expert) or {RANDOM_SHARE['mixed']:.0%} (mixed) uniformly random episodes, "
            f"{config.updates:,} offline updates, zero env steps; offline-to-online: {config.o2o_episodes} expert episodes "
            f"(protected, a quarter of each batch) and {config.o2o_updates:,} offline updates, then online. "
            "The ablation record's model and settings; see the docstring of `benchmarks/offline.py`."
        ),
        "",
        *([] if config.quick else [progress_note(summary), ""]),
        provenance(meta, " per run"),
        "",
        (
            f"Offline: the last evaluation's mean return ({config.eval_episodes} deterministic episodes), as a share of "
            "the expert's, and sampled; one figure per seed."
        ),
        "",
        markdown_table(("cell", "return", "of expert", "sampled return", "updates"), offline),
    ]
    if online:
        lines += [
            "",
            f"Offline-to-online: env steps to a deterministic return of {SOLVED} (`>N`: not reached in N steps).",
            "",
            markdown_table(("cell", "env steps to solved", "last return"), online),
        ]
    return lines


def write_offline_report(store: CurveStore, config: Config) -> None:
    summary = summarize(store.read())
    meta = run_metadata()
    payload = {
        "config": {"env_id": ENV_ID, **BASE, "traj_encoder_kwargs": ENCODER, "quick": config.quick},
        "cells": summary,
        **meta,
    }
    write_report(config.out_dir, config.name, payload, markdown(summary, meta, config))


def main(argv: Sequence[str] | None = None) -> None:
    config = parse_config(argv)
    th.set_num_threads(config.threads)
    store = CurveStore(config.out_dir / f"{config.name}_curves.csv", FIELDS)
    if not config.report_only:
        os.environ.setdefault("MINARI_DATASETS_PATH", tempfile.mkdtemp(prefix="sb3amago-minari-"))
        for cell in config.cells:
            for seed in config.seeds:
                done = store.drop_unfinished(lambda r: (r["cell"], r["seed"]), only=[(cell, seed)])
                if (cell, seed) in done:
                    continue
                run_cell(config, cell, seed, store)
    write_offline_report(store, config)


if __name__ == "__main__":
    sys.exit(main())
