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
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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
from stable_baselines3.common.env_util import make_vec_env

from sb3_amago import AMAGO

ENV_ID = "amago-popgym-RepeatPreviousEasy-v0"
THRESHOLDS = (0.9, 0.99)
EVAL_EPISODES = 16
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
    "n_step_5": ("5-step TD targets inside the window (n_step 5)", {"n_step": 5}, {}),
    "bf16": ("bf16 autocast of the update (mixed_precision=True)", {"mixed_precision": True}, {}),
    "compiled": ("the update's forward compiled (compile_model=True)", {"compile_model": True}, {}),
    "bf16_compiled": (
        "bf16 autocast and the update's forward compiled (mixed_precision=True, compile_model=True)",
        {"mixed_precision": True, "compile_model": True},
        {},
    ),
    "overlap": (
        "collection beside training: each update round in a worker thread (overlap_collection=True)",
        {"overlap_collection": True},
        {},
    ),
}


def make_model(variant: str, seed: int, device: str) -> AMAGO:
    _, overrides, policy = VARIANTS[variant]
    env = make_vec_env(ENV_ID, n_envs=N_ENVS, seed=seed)
    policy_kwargs = {**policy, "traj_encoder_kwargs": {**BASE_ENCODER, **policy.get("traj_encoder_kwargs", {})}}
    return AMAGO("TransformerPolicy", env, seed=seed, device=device, policy_kwargs=policy_kwargs, **{**BASE, **overrides})


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    finished = {return_run(r) for r in rows if r["final"]}
    out: dict[str, dict[str, Any]] = {}
    for variant in dict.fromkeys(r["variant"] for r in rows):
        seeds = sorted(s for v, s in finished if v == variant)
        entry: dict[str, Any] = {"changes": VARIANTS.get(variant, ("(removed variant)",))[0], "seeds": seeds}
        for threshold in THRESHOLDS:
            hits = [first_reach([r for r in rows if return_run(r) == (variant, seed)], threshold) for seed in seeds]
            entry[f"to_{threshold:g}"] = [
                None if hit is None else {"env_steps": hit["env_steps"], "train_s": hit["wall_s"]} for hit in hits
            ]
        entry["budget_steps"] = [max(r["env_steps"] for r in rows if return_run(r) == (variant, s)) for s in seeds]
        out[variant] = entry
    return out


def markdown(summary: dict[str, dict[str, Any]], meta: dict[str, Any], note: str) -> list[str]:
    def cell(values: list[dict[str, Any] | None], budgets: list[int], key: str) -> str:
        return per_seed(
            f"{v[key]:,.0f}" if v else f">{b:,}" if key == "env_steps" else "-" for v, b in zip(values, budgets, strict=True)
        )

    table = [
        (
            name,
            e["changes"],
            cell(e["to_0.9"], e["budget_steps"], "env_steps"),
            cell(e["to_0.99"], e["budget_steps"], "env_steps"),
            cell(e["to_0.99"], e["budget_steps"], "train_s"),
        )
        for name, e in summary.items()
    ]
    return [
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
        markdown_table(("variant", "what it changes", "steps to 0.9", "steps to 0.99", "seconds to 0.99"), table),
    ]


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
    store = CurveStore(args.out_dir / "ablations_curves.csv", RETURN_FIELDS)
    if not args.report_only:
        for variant in args.variants:
            for seed in args.seeds:
                if (variant, seed) in store.finished(return_run):
                    continue
                train_with_returns(
                    make_model(variant, seed, args.device),
                    variant,
                    seed,
                    args.eval_every,
                    args.budget,
                    store,
                    ENV_ID,
                    THRESHOLDS[-1],
                    EVAL_EPISODES,
                )
    write_ablation_report(store, args.out_dir)


def write_ablation_report(store: CurveStore, out_dir: Path) -> None:
    rows = store.read()
    finished = {(*return_run(r), r["attempt"]) for r in rows if r["final"]}
    rows = [r for r in rows if (*return_run(r), r["attempt"]) in finished]
    summary = summarize(rows)
    meta = run_metadata()
    config = {"env_id": ENV_ID, "n_envs": N_ENVS, **BASE, "traj_encoder_kwargs": BASE_ENCODER, "eval_episodes": EVAL_EPISODES}
    write_report(out_dir, "ablations", {"config": config, "variants": summary, **meta}, markdown(summary, meta, NOTE))


if __name__ == "__main__":
    sys.exit(main())
