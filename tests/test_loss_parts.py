"""Hand checks of the loss's building blocks: PopArt, the random critic pair, the TD target, masks."""

import pytest
import torch as th
from test_amago import ACTION_SPACES, CountingEnv, filled_model

from sb3_amago import PrevRewardWrapper
from sb3_amago.loss import LossConfig, amago_loss, masked_mean, pick_critics, td_target
from sb3_amago.nets.popart import PopArt


def test_popart_update_preserves_outputs() -> None:
    popart = PopArt(n_gammas=3)
    raw_q = th.randn(5, 7, 4, 3)
    with th.no_grad():
        popart.w.copy_(th.tensor([0.5, 1.5, -2.0]))
        popart.b.copy_(th.tensor([0.1, -0.3, 2.0]))
    before = popart.denormalize(raw_q)
    targets = 50.0 * th.randn(5, 7, 3) + 20.0
    mask = th.rand(5, 7) > 0.3
    popart.update_stats(targets, mask)
    th.testing.assert_close(popart.denormalize(raw_q), before, atol=1e-4, rtol=1e-5)


def test_popart_first_update_is_bias_corrected_masked_mean() -> None:
    popart = PopArt(n_gammas=2, beta=5e-4)
    targets = th.tensor([[[1.0, 10.0], [3.0, 30.0], [1000.0, 1000.0]]])  # (1, 3, 2)
    mask = th.tensor([[True, True, False]])
    popart.update_stats(targets, mask)
    # Rate 1 on the first update: the statistics become the masked moments exactly.
    th.testing.assert_close(popart.mu, th.tensor([2.0, 20.0]))
    th.testing.assert_close(popart.nu, th.tensor([5.0, 500.0]))
    th.testing.assert_close(popart.sigma, th.tensor([1.0, 10.0]))
    # Second update: bias-corrected rate beta / (1 - (1 - beta)^2).
    rate = 5e-4 / (1 - (1 - 5e-4) ** 2)
    popart.update_stats(th.zeros(1, 3, 2), th.ones(1, 3, dtype=th.bool))
    th.testing.assert_close(popart.mu, (1 - rate) * th.tensor([2.0, 20.0]))


def _frequencies(values: th.Tensor, outcomes: list[float]) -> list[float]:
    """Share of ``values`` equal to each outcome (every value must be one of them)."""
    hits = th.stack([values == v for v in outcomes])
    assert bool(hits.any(0).all()), "a value outside the possible outcomes"
    return hits.flatten(1).float().mean(1).tolist()


def test_pick_critics_min_of_two_draws_with_replacement_per_position() -> None:
    """The min of n=2 critics drawn with replacement, independently per (b, t, g), and their mean without reduce_min."""
    B, L, C, G = 100, 100, 4, 10  # 100k positions
    critic_value = th.tensor([2.0, 0.0, 3.0, 1.0])  # critic c always outputs critic_value[c] (+ 100 g)
    offset = 100.0 * th.arange(G).float()
    q = (critic_value.view(1, 1, C, 1) + offset).expand(B, L, C, G).contiguous()

    got = pick_critics(q, 2, reduce_min=True) - offset  # (B, L, G), back to critic values
    # min of two uniform draws with replacement over the sorted values 0 < 1 < 2 < 3:
    # P(min = k-th smallest) = ((C - k)^2 - (C - k - 1)^2) / C^2 = 7/16, 5/16, 3/16, 1/16. Without
    # replacement it would be 3/6, 2/6, 1/6, 0: the largest value needs the same critic drawn twice.
    freqs = _frequencies(got, [0.0, 1.0, 2.0, 3.0])
    for freq, expected in zip(freqs, [7 / 16, 5 / 16, 3 / 16, 1 / 16]):
        assert abs(freq - expected) < 0.01, freqs
    # Draws are independent across batch, time and gamma: two neighbours agree with probability
    # sum_k p_k^2 = 84/256, not 1 as they would if one draw were shared along that axis.
    for a, b in ((got[1:], got[:-1]), (got[:, 1:], got[:, :-1]), (got[..., 1:], got[..., :-1])):
        assert abs((a == b).float().mean().item() - 84 / 256) < 0.01

    value = th.tensor([4.0, 0.0, 16.0, 1.0])  # every pair of critics has a distinct mean
    q = (value.view(1, 1, C, 1) + offset).expand(B, L, C, G).contiguous()
    got = pick_critics(q, 2, reduce_min=False) - offset
    pairs = [(i, j) for i in range(C) for j in range(i, C)]
    outcomes = [float(value[i] + value[j]) / 2 for i, j in pairs]
    expected = [1 / 16 if i == j else 2 / 16 for i, j in pairs]
    for freq, p in zip(_frequencies(got, outcomes), expected):
        assert abs(freq - p) < 0.01


def test_td_target_by_hand() -> None:
    """y = k r + gamma (1 - d) q per (b, t, g), with q the same for every critic here."""
    q = th.tensor([[[2.0, 4.0], [6.0, 8.0], [-1.0, 3.0]]])  # (B=1, L=3, G=2)
    q_next = q.unsqueeze(2).expand(1, 3, 4, 2)  # four identical critics
    reward = th.tensor([[1.0, 0.5, -2.0]])
    terminated = th.tensor([[0.0, 1.0, 0.0]])
    gammas = th.tensor([0.5, 0.9])
    got = td_target(q_next, reward, terminated, gammas, LossConfig(reward_multiplier=10.0))
    expected = th.tensor([[[10 + 0.5 * 2, 10 + 0.9 * 4], [5.0, 5.0], [-20 + 0.5 * -1, -20 + 0.9 * 3]]])
    th.testing.assert_close(got, expected)


@pytest.mark.parametrize(
    ("settings", "outcomes", "expected"),
    [
        ({"n_target_critics": 2}, [1.0, 5.0], [3 / 4, 1 / 4]),  # min of 2 draws
        ({"n_target_critics": 3}, [1.0, 5.0], [7 / 8, 1 / 8]),  # min of 3 draws
        ({"n_target_critics": 1}, [1.0, 5.0], [1 / 2, 1 / 2]),  # one critic
        ({"n_target_critics": 2, "pg_weight": 0.0}, [1.0, 3.0, 5.0], [1 / 4, 1 / 2, 1 / 4]),  # mean of 2 draws
    ],
)
def test_td_target_bootstraps_from_the_picked_critics(settings: dict, outcomes: list[float], expected: list[float]) -> None:
    """The bootstrap value is the min (mean when pg_weight is 0) of cfg.n_target_critics critics drawn with replacement."""
    B, L, G = 100, 100, 2
    q_next = th.tensor([1.0, 5.0]).view(1, 1, 2, 1).expand(B, L, 2, G)  # critic 0 says 1, critic 1 says 5
    target = td_target(q_next, th.zeros(B, L), th.zeros(B, L), th.tensor([0.5, 0.5]), LossConfig(**settings))
    for freq, p in zip(_frequencies(target / 0.5, outcomes), expected):
        assert abs(freq - p) < 0.02


def _perturb(module: th.nn.Module) -> None:
    """Add noise to every parameter of ``module``."""
    with th.no_grad():
        for p in module.parameters():
            p.add_(0.5 * th.randn_like(p))


@pytest.mark.parametrize("action_space", ["discrete", "box"])
def test_td_target_comes_from_the_target_heads(action_space: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Changing the online actor / critics leaves amago_loss's TD target unchanged; changing the target heads changes it."""
    model = filled_model(PrevRewardWrapper(CountingEnv(action_space=ACTION_SPACES[action_space])), steps=24)
    policy = model.policy
    policy.set_training_mode(False)  # no dropout, no running-statistics updates
    batch = model.replay_buffer.sample(4)
    popart_state = {k: v.clone() for k, v in policy.popart.state_dict().items()}
    targets: list[th.Tensor] = []
    update_stats = policy.popart.update_stats

    def recording_update_stats(target: th.Tensor, mask: th.Tensor) -> None:
        targets.append(target.clone())
        update_stats(target, mask)

    monkeypatch.setattr(policy.popart, "update_stats", recording_update_stats)

    def target() -> th.Tensor:
        policy.popart.load_state_dict(popart_state)  # the target is denormalised with PopArt's statistics
        th.manual_seed(1)  # same critic draws (and Box policy samples) every time
        amago_loss(policy, batch, LossConfig())
        return targets[-1]

    before = target()
    _perturb(policy.actor)
    _perturb(policy.critics)
    assert th.equal(target(), before)
    _perturb(policy.critics_target)
    after_critics = target()
    assert (after_critics - before).abs().max() > 1e-3
    _perturb(policy.actor_target)
    assert (target() - after_critics).abs().max() > 1e-3


def test_masked_mean_ignores_masked_positions_and_broadcasts() -> None:
    x = th.tensor([[[1.0, 3.0], [100.0, 100.0]], [[5.0, 7.0], [9.0, 11.0]]])  # (B=2, L=2, G=2)
    mask = th.tensor([[True, False], [True, True]])
    assert masked_mean(x, mask).item() == (1 + 3 + 5 + 7 + 9 + 11) / 6
