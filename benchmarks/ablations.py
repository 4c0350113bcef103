"""Ablation record: which setting of each default learns fastest on POPGym RepeatPreviousEasy.

    python benchmarks/ablations.py                                   # every variant, seeds 0 1 2
    python benchmarks/ablations.py --variants sinusoidal rotary --seeds 0 1 2
    python benchmarks/ablations.py --report-only                     # table + json from the CSV

Fixed settings (the side-by-side comparison with the original AMAGO used them): 8 envs, batches of
24 windows of 53 steps (``max_seq_len`` 52), a Transformer of d_model 128 x 3 layers x 8 heads
(d_ff 512), lr 1e-4, one update per 8 env steps (``train_freq`` 1, ``gradient_steps`` 1). Every
other setting is the package's default unless the variant changes it. Each run evaluates every
``--eval-every`` env steps on 16 deterministic episodes and stops at ``--budget`` env steps or once
the mean return has been >= 0.99 at two evaluations in a row (the record is steps to a threshold,
not a final score). Runs are sequential inside one process, one torch thread by default; two
processes with disjoint ``--variants`` / ``--seeds`` can share the CSV (rows are appended whole).

Results: ``benchmarks/results/ablations_curves.csv`` (one row per evaluation; resumable: finished
``(variant, seed)`` runs are skipped, unfinished ones restart) and ``ablations.md`` / ``.json``: env
steps and training seconds to a mean return of 0.9 and 0.99 per seed (evaluation time excluded).
"""

import argparse
import csv
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch as th
from common import add_learning_run_args, provenance, run_metadata
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy

from sb3_amago import AMAGO

ENV_ID = "amago-popgym-RepeatPreviousEasy-v0"
THRESHOLDS = (0.9, 0.99)
EVAL_EPISODES = 16
EVAL_SEED_OFFSET = 10_000
FIELDS = ("variant", "seed", "attempt", "env_steps", "wall_s", "mean_return", "final")

#: The settings every variant shares.
BASE: dict[str, Any] = {
    "batch_size": 24,
    "max_seq_len": 52,
    "learning_rate": 1e-4,
    "train_freq": 1,
    "gradient_steps": 1,
}
BASE_ENCODER: dict[str, Any] = {"d_model": 128, "n_heads": 8, "n_layers": 3, "d_ff": 512}
N_ENVS = 8

#: The original AMAGO's extra discount factors on POPGym (the main gamma, 0.999, comes last).
PAPER_GAMMAS = (0.7, 0.9, 0.93, 0.95, 0.98, 0.99, 0.992, 0.994, 0.995, 0.997, 0.998, 0.9991, 0.9992, 0.9993, 0.9994, 0.9995)

#: Variant name -> (what it changes, AMAGO keyword overrides, policy keyword overrides; a
#: ``traj_encoder_kwargs`` there is merged into :data:`BASE_ENCODER`).
VARIANTS: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "defaults": ("the package's defaults (rotary positions)", {}, {}),
    "sinusoidal": ("fixed sinusoidal positions added to the input", {}, {"traj_encoder_kwargs": {"pos_emb": "sinusoidal"}}),
    "learnable": (
        "a learnable position table (1,000 rows)",
        {},
        {"traj_encoder_kwargs": {"pos_emb": "learnable", "max_time": 1000}},
    ),
    "rotary": (
        "rotary position embedding of queries and keys (relative, no table)",
        {},
        {"traj_encoder_kwargs": {"pos_emb": "rotary"}},
    ),
    "none": ("no position information (causal masking only)", {}, {"traj_encoder_kwargs": {"pos_emb": "none"}}),
    "popart_fixed": (
        "PopArt's w, b moved only by its statistics (not trained), no bias correction (the original's)",
        {},
        {"popart_kwargs": {"trainable": False, "bias_correction": False}},
    ),
    "paper_gammas": (f"the original's {len(PAPER_GAMMAS)} extra gammas on POPGym", {"multigammas": PAPER_GAMMAS}, {}),
    "warmup_2000": ("learning-rate warm-up over 2,000 updates (the original's)", {"warmup_steps": 2000}, {}),
    "tau_0.0025": ("target EMA rate 0.0025 (the original's)", {"tau": 0.0025}, {}),
    "d_embed_200": ("timestep embedding of 200 (the original's POPGym 512-512-200)", {}, {"d_embed": 200}),
    "starts_200": (
        "learning_starts 200: almost no uniform-random phase (the original has none)",
        {"learning_starts": 200},
        {},
    ),
    "updates_x2": ("two updates per 8 env steps (gradient_steps 2)", {"gradient_steps": 2}, {}),
    "updates_x3": ("three updates per 8 env steps (gradient_steps 3)", {"gradient_steps": 3}, {}),
}


def make_model(variant: str, seed: int, device: str) -> AMAGO:
    _, overrides, policy = VARIANTS[variant]
    env = make_vec_env(ENV_ID, n_envs=N_ENVS, seed=seed)
    policy_kwargs = {**policy, "traj_encoder_kwargs": {**BASE_ENCODER, **policy.get("traj_encoder_kwargs", {})}}
    return AMAGO("TransformerPolicy", env, seed=seed, device=device, policy_kwargs=policy_kwargs, **{**BASE, **overrides})


class Recorder(BaseCallback):
    """Evaluates every ``every`` env steps on :data:`EVAL_EPISODES` deterministic episodes of
    ``env_id``, appends a CSV row, stops at the budget or once two evaluations in a row reach
    ``stop_return``. Training seconds exclude evaluation."""

    def __init__(
        self,
        variant: str,
        seed: int,
        every: int,
        budget: int,
        csv_path: Path,
        env_id: str = ENV_ID,
        stop_return: float = THRESHOLDS[-1],
    ) -> None:
        super().__init__()
        self.fields = {"variant": variant, "seed": seed, "attempt": int(time.time())}
        self.every, self.budget, self.csv_path, self.stop_return = every, budget, csv_path, stop_return
        self.next_eval = every
        self.start = self.eval_s = 0.0
        self.hits = 0
        self.eval_env = make_vec_env(env_id, n_envs=8, seed=seed + EVAL_SEED_OFFSET)

    def _on_training_start(self) -> None:
        self.start = time.perf_counter()

    def _on_step(self) -> bool:
        if self.num_timesteps < self.next_eval:
            return True
        self.next_eval += self.every
        mean_return = self._evaluate()
        self.hits = self.hits + 1 if mean_return >= self.stop_return else 0
        done = self.hits >= 2 or self.num_timesteps >= self.budget
        self._append(mean_return, final=done)
        return not done

    def _evaluate(self) -> float:
        began = time.perf_counter()
        returns, _ = evaluate_policy(self.model, self.eval_env, EVAL_EPISODES, deterministic=True, return_episode_rewards=True)
        self.eval_s += time.perf_counter() - began
        return float(np.mean(returns))

    def _append(self, mean_return: float, final: bool) -> None:
        wall = time.perf_counter() - self.start - self.eval_s
        row = {
            **self.fields,
            "env_steps": self.num_timesteps,
            "wall_s": round(wall, 1),
            "mean_return": mean_return,
            "final": int(final),
        }
        new = not self.csv_path.exists()
        with open(self.csv_path, "a", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=FIELDS)
            if new:
                writer.writeheader()
            writer.writerow(row)
        print(
            f"{row['variant']:>14} seed {row['seed']} {row['env_steps']:>6} steps  return {mean_return:+.3f}  {wall:6.0f} s",
            flush=True,
        )


def read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    types = {
        "variant": str,
        "seed": int,
        "attempt": int,
        "env_steps": int,
        "wall_s": float,
        "mean_return": float,
        "final": int,
    }
    with open(path, newline="") as file:
        return [{k: types[k](v) for k, v in row.items()} for row in csv.DictReader(file)]


def first_reach(rows: Sequence[dict[str, Any]], threshold: float) -> tuple[int, float] | None:
    """(env steps, training seconds) of the first evaluation at or above ``threshold``."""
    for row in sorted(rows, key=lambda r: r["env_steps"]):
        if row["mean_return"] >= threshold:
            return row["env_steps"], row["wall_s"]
    return None


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    finished = {(r["variant"], r["seed"]) for r in rows if r["final"]}
    out: dict[str, dict[str, Any]] = {}
    for variant in dict.fromkeys(r["variant"] for r in rows):
        seeds = sorted(s for v, s in finished if v == variant)
        entry: dict[str, Any] = {"changes": VARIANTS.get(variant, ("(removed variant)",))[0], "seeds": seeds}
        for threshold in THRESHOLDS:
            per_seed = []
            for seed in seeds:
                hit = first_reach([r for r in rows if r["variant"] == variant and r["seed"] == seed], threshold)
                per_seed.append(None if hit is None else {"env_steps": hit[0], "train_s": hit[1]})
            entry[f"to_{threshold:g}"] = per_seed
        entry["budget_steps"] = [
            max(r["env_steps"] for r in rows if r["variant"] == variant and r["seed"] == s) for s in seeds
        ]
        out[variant] = entry
    return out


def markdown(summary: dict[str, dict[str, Any]], meta: dict[str, Any], note: str) -> str:
    def cell(values: list[dict[str, Any] | None], budgets: list[int], key: str) -> str:
        parts = [
            f"{v[key]:,.0f}" if v else f">{b:,}" if key == "env_steps" else "-" for v, b in zip(values, budgets, strict=True)
        ]
        return " / ".join(parts)

    lines = [
        "# Ablations on POPGym RepeatPreviousEasy",
        "",
        note,
        "",
        provenance(meta, " per run"),
        "",
        (
            "Env steps (and training seconds, evaluation excluded) to a mean deterministic return of 0.9 / 0.99, "
            "one figure per seed (0 / 1 / 2); `>N`: not reached in the N steps the run took."
        ),
        "",
        "| variant | what it changes | steps to 0.9 | steps to 0.99 | seconds to 0.99 |",
        "|---|---|---|---|---|",
    ]
    for name, e in summary.items():
        b = e["budget_steps"]
        lines.append(
            f"| {name} | {e['changes']} | {cell(e['to_0.9'], b, 'env_steps')} | {cell(e['to_0.99'], b, 'env_steps')} | "
            f"{cell(e['to_0.99'], b, 'train_s')} |"
        )
    return "\n".join(lines) + "\n"


NOTE = (
    "Settings: 8 envs, batch 24 windows of 53 steps, Transformer d_model 128 x 3 layers x 8 heads (d_ff 512), "
    "lr 1e-4, one update per 8 env steps; everything else the package default unless the variant says otherwise. "
    "Evaluation every 500 env steps on 16 deterministic episodes; a run stops after two evaluations in a row at >= 0.99. "
    "Rows were run in pieces, `python benchmarks/ablations.py --variants NAME` (budget 16,000: learnable, "
    "sinusoidal, rotary) or `--budget 12000 --variants NAME` (the others); the table is rebuilt from the CSV by the "
    "command below. Two to six runs shared the 2-core machine (one torch thread each), so seconds are upper "
    "bounds, comparable only roughly."
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--budget", type=int, default=16_000)
    parser.add_argument("--eval-every", type=int, default=500)
    add_learning_run_args(parser)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    th.set_num_threads(args.threads)
    csv_path = args.out_dir / "ablations_curves.csv"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        for variant in args.variants:
            for seed in args.seeds:
                rows = read_rows(csv_path)
                if any(r["final"] and r["variant"] == variant and r["seed"] == seed for r in rows):
                    continue
                model = make_model(variant, seed, args.device)
                model.learn(args.budget, callback=Recorder(variant, seed, args.eval_every, args.budget, csv_path))
    write_report(csv_path, args.out_dir)


def write_report(csv_path: Path, out_dir: Path) -> None:
    import json

    rows = read_rows(csv_path)
    finished = {(r["variant"], r["seed"], r["attempt"]) for r in rows if r["final"]}
    rows = [r for r in rows if (r["variant"], r["seed"], r["attempt"]) in finished]
    summary = summarize(rows)
    meta = run_metadata()
    config = {"env_id": ENV_ID, "n_envs": N_ENVS, **BASE, "traj_encoder_kwargs": BASE_ENCODER, "eval_episodes": EVAL_EPISODES}
    (out_dir / "ablations.json").write_text(json.dumps({"config": config, "variants": summary, **meta}, indent=2) + "\n")
    (out_dir / "ablations.md").write_text(markdown(summary, meta, NOTE))


if __name__ == "__main__":
    sys.exit(main())
