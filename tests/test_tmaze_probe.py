"""benchmarks/tmaze_probe.py: the attention recorder and the junction readings."""

import sys
from pathlib import Path

import gymnasium as gym
import pytest
import torch as th
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from test_amago import tiny_model
from tmaze_probe import probe, recorded_attention


@pytest.mark.parametrize("causal", [True, False])
def test_recorded_attention_gives_the_weights_of_the_call_and_leaves_its_output(causal: bool) -> None:
    gen = th.Generator().manual_seed(0)
    q, k, v = (th.randn(2, 3, 5, 4, generator=gen) for _ in range(3))
    mask = None if causal else th.rand(2, 1, 1, 5, generator=gen) > 0.3
    if mask is not None:
        mask[..., 0] = True  # every query sees one key at least
    weights: list[th.Tensor] = []
    sdpa = F.scaled_dot_product_attention
    with recorded_attention(weights):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
    assert th.equal(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal))
    assert len(weights) == 1 and weights[0].shape == (2, 3, 5, 5)
    th.testing.assert_close(weights[0].sum(-1), th.ones(2, 3, 5))
    th.testing.assert_close(weights[0] @ v, out)
    hidden = th.ones(5, 5, dtype=th.bool).triu(1) if causal else ~mask.expand(2, 3, 5, 5)
    assert (weights[0][hidden.expand(2, 3, 5, 5)] == 0).all(), "no weight on a key the call hides"
    assert F.scaled_dot_product_attention is sdpa, "the recorder is gone after the context"


def test_probe_reads_both_goal_sides_at_the_junction(tmp_path: Path) -> None:
    corridor = 4
    model = tiny_model(gym.make("amago-TMaze-v0", corridor_length=corridor), max_seq_len=corridor + 1)
    model.learn(12)
    model.save(tmp_path / "model.zip")
    row = probe(tmp_path / "model.zip", corridor)
    assert row["reached"] in (0.0, 0.5, 1.0) and row["success"] in (0.0, 0.5, 1.0)
    assert 0.0 <= row["p_goal"] <= row["p_turn"] <= 1.0
    assert row["log10_p_goal_raw"] <= 0.0
    assert row["state_gap"] > 0.0, "the two episodes differ in their cue, so their states differ"
    n_layers = len(model.policy.traj_encoder.blocks)
    for layer in range(n_layers):
        assert 0.0 < row[f"cue_attention_l{layer}"] <= row[f"cue_attention_l{layer}_max_head"] <= 1.0
    assert f"cue_attention_l{n_layers}" not in row
