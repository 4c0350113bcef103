"""What a trained T-maze agent knows at the junction: does its Transformer carry the cue there?

For each saved model (``AMAGO.save`` zips, e.g. the checkpoints ``learning.py --checkpoint-dir``
writes at each evaluation) the probe plays one greedy episode per goal side of the passive T-maze
and reads, at the junction (the step where the choice is made):

- ``reached``: the greedy walk stands at the junction when it chooses (both sides: 1);
- ``success``: the greedy turn is the goal side, for both sides;
- ``p_goal``: the main-gamma actor's probability of the goal-side turn (mean over the two sides;
  the probabilities the agent acts with, clamped to [0.001, 0.99]); ``log10 p_goal, raw``: the
  smaller over the two sides of log10 of the same probability before the clamp (the softmax of
  the logits), which shows how far below the clamp the policy has pushed the right turn;
  ``p_turn``: of either turn (a memoryless agent that turns has ``p_goal`` = ``p_turn`` / 2);
- ``q_gap``: the critics' main-gamma value of the goal-side turn minus the other turn (mean over
  critics and sides): the critics know the cue when it is clearly positive;
- ``state_gap``: how far apart the encoder's output states of the two episodes are, relative to
  their size (``|h_up - h_down| / mean |h|``); the two episodes differ only in their first
  observation (the cue), so a gap near 0 means the cue is gone from the state the heads read;
- ``cue_attention``: per layer, the attention weight (mean over heads, and the largest head's)
  that the junction step puts on the cue step (t = 0), the only step that shows the goal side.

    python benchmarks/tmaze_probe.py MODEL.zip [MODEL.zip ...] --corridor 100 --name tmaze_probe_seed2

Results: ``benchmarks/results/<name>.json`` / ``.md``, one row per model, labelled with its env
steps where a ``meta.json`` of ``learning.py``'s checkpoints lies beside it.
"""

import argparse
import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import gymnasium as gym
import torch as th
from common import checkpoint_label, run_metadata
from curves import table_report, write_report
from torch.nn import functional as F

import sb3_amago  # noqa: F401  (registers the envs)
from sb3_amago import AMAGO
from sb3_amago.envs.tmaze import TMazeEnv


@contextlib.contextmanager
def recorded_attention(weights: list[th.Tensor]) -> Iterator[None]:
    """Inside the context, every ``scaled_dot_product_attention`` call also appends its attention
    weights ``(N, H, Lq, Lk)`` to ``weights`` (computed from its query, key and mask)."""
    sdpa = F.scaled_dot_product_attention

    def recording(
        q: th.Tensor, k: th.Tensor, v: th.Tensor, attn_mask: Any = None, is_causal: bool = False, **kw: Any
    ) -> th.Tensor:
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (N, H, Lq, Lk)
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, -math.inf)
        if is_causal:
            lq, lk = scores.shape[-2:]
            scores = scores.masked_fill(th.ones(lq, lk, dtype=th.bool).triu(lk - lq + 1), -math.inf)
        weights.append(scores.softmax(-1))
        return sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kw)

    with mock.patch.object(F, "scaled_dot_product_attention", recording):
        yield


def junction_readout(model: AMAGO, corridor: int, goal_up: bool) -> dict[str, Any]:
    """Play one greedy episode with the goal on ``goal_up``'s side; the junction step's readings."""
    env = gym.make("amago-TMaze-v0", corridor_length=corridor)
    obs, _ = env.reset(seed=0)
    maze = env.unwrapped
    assert isinstance(maze, TMazeEnv)
    maze._goal_up = goal_up  # the side is drawn at reset: set it, and show it in the first observation
    obs["observation"] = maze._obs(show_cue=True)
    policy = model.policy
    states: list[th.Tensor] = []  # the encoder's output state of each step
    step = policy.traj_encoder.step

    def recording_step(*args: Any) -> Any:
        out = step(*args)
        states.append(out[0])
        return out

    weights: list[th.Tensor] = []
    state = None
    with mock.patch.object(policy.traj_encoder, "step", recording_step):
        for _ in range(corridor):
            action, state = model.predict(obs, state, deterministic=True)
            obs, *_ = env.step(action)
        reached = bool(obs["observation"][2])  # the junction flag of the observation the choice is made on
        with recorded_attention(weights):
            action, state = model.predict(obs, state, deterministic=True)
    _, _, terminated, _, info = env.step(action)
    assert terminated, "the choice ends the episode"
    hidden = states[-1]  # (1, D)
    goal, other = (TMazeEnv.UP, TMazeEnv.DOWN) if goal_up else (TMazeEnv.DOWN, TMazeEnv.UP)
    with th.no_grad():
        actor_out = policy.actor(hidden)
        probs = actor_out.probs[0, -1]  # (A,): the main gamma's probabilities
        log_p_goal_raw = policy.action_type.log_prob(actor_out, th.tensor([[float(goal)]]))[
            0, -1
        ]  # before the clamp (log-softmax)
        q = policy.popart.denormalize(policy.critics(hidden).transpose(-1, -2))[0, :, :, -1]  # (C, A), main gamma
    return {
        "reached": reached,
        "success": bool(info["success"]),
        "p_goal": float(probs[goal]),
        "log10_p_goal_raw": float(log_p_goal_raw) / math.log(10.0),
        "p_turn": float(probs[goal] + probs[other]),
        "q_gap": float((q[:, goal] - q[:, other]).mean()),
        "hidden": hidden[0],
        # per layer: the junction query's weight on the cue step (key 0), (H,)
        "cue_attention": [w[0, :, -1, 0] for w in weights],
    }


def probe(path: Path, corridor: int) -> dict[str, Any]:
    """The readings of one saved model (see the module docstring)."""
    model = AMAGO.load(path, device="cpu")
    up, down = (junction_readout(model, corridor, side) for side in (True, False))
    h_up, h_down = up["hidden"], down["hidden"]
    row: dict[str, Any] = {
        "reached": (up["reached"] + down["reached"]) / 2,
        "success": (up["success"] + down["success"]) / 2,
        "p_goal": (up["p_goal"] + down["p_goal"]) / 2,
        "log10_p_goal_raw": min(up["log10_p_goal_raw"], down["log10_p_goal_raw"]),
        "p_turn": (up["p_turn"] + down["p_turn"]) / 2,
        "q_gap": (up["q_gap"] + down["q_gap"]) / 2,
        "state_gap": float((h_up - h_down).norm() / ((h_up.norm() + h_down.norm()) / 2)),
    }
    for layer, (a_up, a_down) in enumerate(zip(up["cue_attention"], down["cue_attention"], strict=True)):
        both = th.stack([a_up, a_down])  # (2, H)
        row[f"cue_attention_l{layer}"] = float(both.mean())
        row[f"cue_attention_l{layer}_max_head"] = float(both.mean(0).max())
    return row


COLUMNS = (
    ("reached", "reached", ".1f"),
    ("success", "success", ".1f"),
    ("p_turn", "p_turn", ".3f"),
    ("p_goal", "p_goal", ".3f"),
    ("log10_p_goal_raw", "log10 p_goal, raw", ".1f"),
    ("q_gap", "q_gap", ".1f"),
    ("state_gap", "state_gap", ".2f"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", type=Path, help="saved models (.zip)")
    parser.add_argument("--corridor", type=int, default=100, help="the T-maze's corridor length H")
    parser.add_argument("--name", default="tmaze_probe", help="results file name")
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    th.set_num_threads(1)
    rows = []
    for path in args.models:
        row = {"model": checkpoint_label(path), **probe(path, args.corridor)}
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
        rows.append(row)
    n_layers = sum(key.endswith("_max_head") for key in rows[0])
    header = (
        "model",
        *(title for _, title, _ in COLUMNS),
        *(f"cue attention, layer {i} (mean / max head)" for i in range(n_layers)),
    )
    table = [
        (
            row["model"],
            *(format(row[key], fmt) for key, _, fmt in COLUMNS),
            *(f"{row[f'cue_attention_l{i}']:.3f} / {row[f'cue_attention_l{i}_max_head']:.3f}" for i in range(n_layers)),
        )
        for row in rows
    ]
    meta = run_metadata()
    description = (
        f"Greedy episodes of the passive T-maze, H = {args.corridor}, one per goal side; readings at the junction "
        "(columns: see the docstring of `benchmarks/tmaze_probe.py`). Uniform attention over the junction's "
        f"context puts {1 / (args.corridor + 1):.3f} on the cue step."
    )
    lines = table_report(args.name, meta, description, header, table)
    write_report(args.out_dir, args.name, {"corridor": args.corridor, "rows": rows, **meta}, lines)


if __name__ == "__main__":
    main()
