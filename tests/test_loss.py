"""The loss: its terms against hand computations (PopArt, the random critic pair, the TD target,
the behaviour-cloning filter, masks), where each term's gradients go, and padding."""

import copy
import warnings

import numpy as np
import pytest
import torch as th
from test_amago import ACTION_SPACES, CountingEnv, filled_model

from sb3_amago import AMAGO, PrevRewardWrapper
from sb3_amago.loss import (
    LossConfig,
    amago_loss,
    bc_filter,
    behaviour_cloning_loss,
    masked_mean,
    n_step_target,
    pick_critics,
    target_values,
    td_target,
    update_forward,
)
from sb3_amago.nets.popart import PopArt, PopArtStats
from sb3_amago.policies import TransformerPolicy
from sb3_amago.type_aliases import TrajectoryBatch


def loss_of(policy: TransformerPolicy, batch: TrajectoryBatch, cfg: LossConfig) -> tuple[th.Tensor, dict]:
    """The loss as a training step computes it: encode, TD target, PopArt update, loss."""
    states = policy.encode(batch.observations, batch.prev_actions, batch.time_idx, batch.real)
    target = target_values(policy, batch, states, cfg)
    policy.popart.update_stats(target, batch.real[:, 1:])
    return amago_loss(policy, batch, states, target, cfg)


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


@pytest.mark.parametrize("any_real", [True, False])
def test_popart_moved_is_the_update_as_values_and_gradient(any_real: bool) -> None:
    """``moved`` returns what ``update_stats`` leaves, to the bit, and leaves the module as it was;
    a loss read through the moved ``w`` and ``b`` has the gradient of the loss of the updated
    parameters, and ``load`` writes the move. A batch without real targets moves nothing."""
    popart = PopArt(n_gammas=3)
    with th.no_grad():
        popart.w.copy_(th.tensor([0.5, 1.5, -2.0]))
        popart.b.copy_(th.tensor([0.1, -0.3, 2.0]))
    popart.update_stats(50.0 * th.randn(4, 3) + 3.0, th.ones(4, dtype=th.bool))  # not the first move
    reference = copy.deepcopy(popart)
    targets, raw_q = 50.0 * th.randn(5, 7, 3) + 20.0, th.randn(5, 7, 3)
    mask = (th.rand(5, 7) > 0.3) & any_real
    before = [t.clone() for t in popart.stats()]

    reference.update_stats(targets, mask)
    (reference.normalize(raw_q) ** 2).sum().backward()
    moved = popart.moved(targets, mask)
    for tensor, old in zip(popart.stats(), before, strict=True):
        assert th.equal(tensor, old)
    for tensor, expected in zip(moved, reference.stats(), strict=True):
        assert th.equal(tensor, expected)
    (moved.normalize(raw_q) ** 2).sum().backward()
    assert th.equal(popart.w.grad, reference.w.grad) and th.equal(popart.b.grad, reference.b.grad)
    popart.load(moved)
    for tensor, expected in zip(popart.stats(), reference.stats(), strict=True):
        assert th.equal(tensor, expected)
    assert float(popart.n_updates) == float(before[-1]) + any_real


def test_popart_move_compiles_with_the_eager_gradient() -> None:
    """Compiled in one graph with a loss (as ``update_forward`` is), the move gives the eager
    values and gradients: nothing in it mutates the module, whose parameters the loss trains."""
    popart = PopArt(n_gammas=3)
    popart.update_stats(50.0 * th.randn(4, 3) + 3.0, th.ones(4, dtype=th.bool))

    def moved_loss(targets: th.Tensor, mask: th.Tensor, raw_q: th.Tensor) -> tuple[th.Tensor, PopArtStats]:
        moved = popart.moved(targets, mask)
        return (moved.normalize(raw_q) - moved.normalize_target(targets)).square().mean(), moved

    compiled = th.compile(moved_loss, dynamic=True)
    th._dynamo.utils.counters.clear()
    for rows in (7, 5):
        targets, raw_q, mask = 50.0 * th.randn(rows, 3) + 20.0, th.randn(rows, 3), th.rand(rows) > 0.3
        losses, grads = [], []
        for fn in (moved_loss, compiled):
            popart.zero_grad()
            loss, moved = fn(targets, mask, raw_q)
            loss.backward()
            losses.append((loss.detach(), [t.detach() for t in moved]))
            grads.append((popart.w.grad.clone(), popart.b.grad.clone()))
        th.testing.assert_close(losses[1], losses[0])
        th.testing.assert_close(grads[1], grads[0])
    assert not th._dynamo.utils.counters["graph_break"]


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


def test_popart_flags_heads_whose_targets_are_nearly_constant() -> None:
    """A head whose targets barely vary (a constant reward at a short horizon) is flagged once its
    output scale w has grown far past the others'; heads with varying targets, near zero mean
    included, are not."""
    popart = PopArt(n_gammas=3)
    generator = th.Generator().manual_seed(0)
    for _ in range(1_500):
        noise = th.randn(64, 3, generator=generator)
        targets = th.tensor([1.1, 5.0, 0.0]) + noise * th.tensor([0.01, 3.0, 10.0])
        popart.update_stats(targets, th.ones(64, dtype=th.bool))
    assert popart.near_constant_heads() == [0]
    w = popart.w.detach()
    assert float(w[0]) > 100 * float(w[1:].abs().max())
    assert PopArt(n_gammas=3).near_constant_heads() == []  # untouched statistics: nothing flagged


def test_training_warns_once_about_nearly_constant_targets() -> None:
    model = filled_model(PrevRewardWrapper(CountingEnv()), steps=24, multigammas=(0.1, 0.9))
    popart = model.policy.popart
    popart.beta, popart.bias_correction = 0.0, False  # the statistics stay as set below
    with th.no_grad():  # the statistics a constant reward leaves at gamma 0.1, the only head flagged
        popart.mu.copy_(th.tensor([1.1, 5.0, 20.0]))
        popart.nu.copy_(th.tensor([1.1**2 + 1e-4, 25.0 + 9.0, 400.0 + 100.0]))
        popart.w.copy_(th.tensor([500.0, 3.0, 2.0]))
    model._n_updates = 998
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.train(gradient_steps=1, batch_size=4)  # 999 updates: not checked yet
    with pytest.warns(
        UserWarning, match=r"gamma 0\.1 \(mean 1\.1.*nearly constant.*remove these discount factors from multigammas"
    ):
        model.train(gradient_steps=1, batch_size=4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.train(gradient_steps=2, batch_size=4)  # once per model


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
def test_td_target_comes_from_the_target_heads(action_space: str) -> None:
    """Changing the online actor / critics leaves the TD target unchanged; changing the target heads changes it."""
    model = filled_model(PrevRewardWrapper(CountingEnv(action_space=ACTION_SPACES[action_space])), steps=24)
    policy = model.policy
    policy.set_training_mode(False)  # no dropout, no running-statistics updates
    batch = model.replay_buffer.sample(4)

    def target() -> th.Tensor:
        th.manual_seed(1)  # same critic draws (and Box policy samples) every time
        states = policy.encode(batch.observations, batch.prev_actions, batch.time_idx, batch.real)
        return target_values(policy, batch, states, LossConfig())

    before = target()
    _perturb(policy.actor)
    _perturb(policy.critics)
    assert th.equal(target(), before)
    _perturb(policy.critics_target)
    after_critics = target()
    assert (after_critics - before).abs().max() > 1e-3
    _perturb(policy.actor_target)
    assert (target() - after_critics).abs().max() > 1e-3


@pytest.mark.parametrize("action_space", ["discrete", "box"])
def test_mixed_precision_keeps_the_loss_in_full_precision(action_space: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under bf16 autocast the heads' products run in bf16, but their outputs, the TD target, its
    discounts and PopArt's statistics are fp32: bf16 would round the discount 0.999 to 1 (and
    0.9995 too), so the long horizons' targets would not be discounted at all."""
    model = filled_model(PrevRewardWrapper(CountingEnv(action_space=ACTION_SPACES[action_space])), steps=24)
    policy = model.policy
    gammas = policy.gamma_values
    assert (gammas.bfloat16().float() == 1.0).any()  # the defaults hold discounts that bf16 rounds to 1
    seen: dict[str, th.Tensor] = {}

    def recording_td_target(q_next, reward, terminated, gammas, cfg, real_next=None):  # type: ignore[no-untyped-def]
        seen["q_next"], seen["gammas"] = q_next, gammas
        return td_target(q_next, reward, terminated, gammas, cfg, real_next)

    monkeypatch.setattr("sb3_amago.loss.td_target", recording_td_target)
    batch = model.replay_buffer.sample(4)
    with th.autocast(model.device.type, dtype=th.bfloat16):
        states = policy.encode(batch.observations, batch.prev_actions, batch.time_idx, batch.real)
        target = target_values(policy, batch, states, LossConfig())
        actor_out = policy.actor(states)
    assert states.dtype == th.bfloat16  # the encoder does run in bf16
    assert seen["q_next"].dtype == target.dtype == th.float32
    assert th.equal(seen["gammas"], gammas)
    assert all(t.dtype == th.float32 for t in actor_out)  # probabilities / (mean, log_std)


def test_popart_statistics_move_in_the_training_step_not_in_the_loss() -> None:
    """``update_forward`` (and the loss in it) leaves PopArt as it is and returns the move, the one
    the loss read; AMAGO.train writes it into the module."""
    model = filled_model(PrevRewardWrapper(CountingEnv()), steps=24)
    policy = model.policy
    batch = model.replay_buffer.sample(4)
    before = {k: v.clone() for k, v in policy.popart.state_dict().items()}
    _, _, moved = update_forward(policy, batch, LossConfig())
    for key, value in policy.popart.state_dict().items():
        assert th.equal(value, before[key]), key
    assert moved is not None and not th.equal(moved.mu, before["mu"])
    model.train(gradient_steps=1, batch_size=4)
    assert not th.equal(policy.popart.mu, before["mu"])


def test_masked_mean_ignores_masked_positions_and_broadcasts() -> None:
    x = th.tensor([[[1.0, 3.0], [100.0, 100.0]], [[5.0, 7.0], [9.0, 11.0]]])  # (B=2, L=2, G=2)
    mask = th.tensor([[True, False], [True, True]])
    assert masked_mean(x, mask).item() == (1 + 3 + 5 + 7 + 9 + 11) / 6


# --------------------------------------------------------------------------------------------
# Loss terms by hand
# --------------------------------------------------------------------------------------------
def test_td_target_uses_a_random_critic_pair_per_position() -> None:
    B, L, C, G = 2, 3, 4, 2
    q_next = th.randn(B, L, C, G)
    reward = th.tensor([[1.0, 0.0, 2.0], [0.5, -1.0, 0.0]])
    terminated = th.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    gammas = th.tensor([0.9, 0.99])
    cfg = LossConfig(reward_multiplier=10.0)
    th.manual_seed(7)
    got = td_target(q_next, reward, terminated, gammas, cfg)
    th.manual_seed(7)
    idx = th.randint(C, (B, L, 2, G))
    for b in range(B):
        for t in range(L):
            for g in range(G):
                q = min(q_next[b, t, idx[b, t, 0, g], g], q_next[b, t, idx[b, t, 1, g], g])
                expected = 10.0 * reward[b, t] + gammas[g] * (1 - terminated[b, t]) * q
                assert got[b, t, g].item() == pytest.approx(expected.item(), abs=1e-5)
    # Without the policy-gradient term the pair is averaged instead.
    th.manual_seed(7)
    mean_target = td_target(q_next, reward, terminated, gammas, LossConfig(pg_weight=0.0))
    q = (q_next[0, 0, idx[0, 0, 0, 1], 1] + q_next[0, 0, idx[0, 0, 1, 1], 1]) / 2
    assert mean_target[0, 0, 1].item() == pytest.approx((10.0 + 0.99 * q).item(), abs=1e-5)


def test_n_step_target_by_hand() -> None:
    """Window 0: 4 real next steps, the last terminal; window 1: 2 real next steps (a time limit),
    then padding. n = 3, gamma 0.5, reward multiplier 2."""
    reward = th.tensor([[1.0, 2.0, 3.0, 4.0, 0.0], [10.0, 20.0, 0.0, 0.0, 0.0]])
    terminated = th.tensor([[0.0, 0.0, 0.0, 1.0, 0.0], [0.0] * 5])
    real_next = th.tensor([[True, True, True, True, False], [True, True, False, False, False]])
    q = th.tensor([[100.0, 200.0, 300.0, 400.0, 500.0], [1000.0, 2000.0, 3000.0, 4000.0, 5000.0]]).unsqueeze(-1)
    got = n_step_target(q, reward, terminated, real_next, th.tensor([0.5]), n=3, k=2.0)[..., 0]
    g = 0.5
    expected_0 = [
        2 * (1 + g * 2 + g**2 * 3) + g**3 * 300,  # three rewards, bootstrap from s_3
        2 * (2 + g * 3 + g**2 * 4) + 0.0,  # reaches the terminal s_4: no bootstrap
        2 * (3 + g * 4) + 0.0,  # truncated by the terminal after two steps
        2 * 4 + 0.0,
    ]
    expected_1 = [
        2 * (10 + g * 20) + g**2 * 2000,  # the window ends after two steps: bootstrap from its last state
        2 * 20 + g * 2000,
    ]
    th.testing.assert_close(got[0, :4], th.tensor(expected_0))
    th.testing.assert_close(got[1, :2], th.tensor(expected_1))
    # Through td_target (its critic pick on one critic), and n = 1 is the one-step target.
    cfg = LossConfig(n_step=3, reward_multiplier=2.0, n_target_critics=1)
    via = td_target(q.unsqueeze(-2), reward, terminated, th.tensor([0.5]), cfg, real_next)[..., 0]
    th.testing.assert_close(via[real_next], got[real_next])
    one = n_step_target(q, reward, terminated, real_next, th.tensor([0.5]), n=1, k=2.0)
    one_step = 2.0 * reward.unsqueeze(-1) + 0.5 * (1.0 - terminated.unsqueeze(-1)) * q
    th.testing.assert_close(one[real_next], one_step[real_next])
    # An n longer than the window stops at the window's end, as n = L does.
    longer = n_step_target(q, reward, terminated, real_next, th.tensor([0.5]), n=12, k=2.0)
    th.testing.assert_close(longer, n_step_target(q, reward, terminated, real_next, th.tensor([0.5]), n=5, k=2.0))
    with pytest.raises(ValueError, match="n_step"):
        LossConfig(n_step=0)


@pytest.mark.parametrize("n", [2, 3, 9, 16, 40])
@pytest.mark.parametrize("autocast", [False, True])
def test_n_step_target_matches_the_sum_written_out(n: int, autocast: bool) -> None:
    """Random windows of varied real lengths, terminal or cut, several gammas: the target equals
    its definition summed term by term for each (b, t, g) over the real steps alone, in fp32 also
    under bf16 autocast."""
    gen = th.Generator().manual_seed(0)
    B, L = 6, 16
    lengths = th.tensor([16, 16, 11, 5, 1, 8])  # real next steps per window
    real_next = th.arange(L) < lengths.unsqueeze(1)
    terminated = th.zeros(B, L)
    terminated[[1, 3, 4], lengths[[1, 3, 4]] - 1] = 1.0  # windows 1, 3, 4 end on a terminal step
    reward = th.randn(B, L, generator=gen)  # padding holds rewards too: the target must ignore them
    q = th.randn(B, L, 3, generator=gen) * 10
    gammas = th.tensor([0.5, 0.9, 0.999])
    with th.autocast("cpu", dtype=th.bfloat16, enabled=autocast):
        got = n_step_target(q, reward, terminated, real_next, gammas, n=n, k=3.0)
    assert got.dtype == th.float32
    for b in range(B):
        for t in range(int(lengths[b])):
            m = min(n, int(lengths[b]) - t)
            for g, gamma in enumerate(gammas.tolist()):
                rewards = sum(gamma**j * reward[b, t + j].item() for j in range(m))
                bootstrap = gamma**m * (1.0 - terminated[b, t + m - 1].item()) * q[b, t + m - 1, g].item()
                assert got[b, t, g].item() == pytest.approx(3.0 * rewards + bootstrap, rel=1e-5, abs=1e-5)


def test_pure_bc_gradient_is_the_mean_log_prob_of_buffer_actions(counting_model: AMAGO) -> None:
    """pure_bc: the loss is minus the mean log-likelihood of every real buffer action (all gamma
    heads), so its gradient is that of the mean log-prob alone; the critics get none."""
    policy = counting_model.policy
    policy.set_training_mode(False)  # no dropout: two forward passes agree
    np.random.seed(1)
    batch = counting_model.replay_buffer.sample(4)
    params = [p for p in policy.parameters() if p.requires_grad]

    def gradients(loss: th.Tensor) -> list[th.Tensor]:
        grads = th.autograd.grad(loss, params, allow_unused=True)
        return [th.zeros_like(p) if g is None else g for p, g in zip(params, grads)]

    states = policy.encode(batch.observations, batch.prev_actions, batch.time_idx, batch.real)
    loss, stats = behaviour_cloning_loss(policy, batch, states)
    states = policy.encode(batch.observations, batch.prev_actions, batch.time_idx, batch.real)
    log_prob = policy.action_type.log_prob(policy.actor(states[:, :-1]), batch.actions[:, :-1])  # (B, L, G)
    real = batch.real[:, 1:]
    by_hand = -(log_prob * real.unsqueeze(-1)).sum() / (real.sum() * log_prob.shape[-1])
    th.testing.assert_close(loss, by_hand)
    for got, expected in zip(gradients(loss), gradients(by_hand)):
        th.testing.assert_close(got, expected)
    assert set(stats) == {"bc_loss", "entropy"}
    policy.zero_grad(set_to_none=True)
    behaviour_cloning_loss(policy, batch, policy.encode(batch.observations, batch.prev_actions, batch.time_idx, batch.real))[
        0
    ].backward()
    assert _grad_norm(policy.critics) == 0.0 and _grad_norm(policy.actor) > 0.0


def test_bc_filter_binary_and_exp() -> None:
    adv = th.tensor([-1.0, 0.0, 0.5, 10.0])
    assert bc_filter(adv, LossConfig()).tolist() == [0.0, 0.0, 1.0, 1.0]
    exp = bc_filter(adv, LossConfig(filter_kind="exp", filter_beta=2.0, filter_clip=5.0))
    th.testing.assert_close(exp, th.tensor([np.exp(-2.0), 1.0, np.exp(1.0), 5.0], dtype=th.float32))
    with pytest.raises(ValueError, match="filter_kind"):
        LossConfig(filter_kind="advantage")


@pytest.fixture(scope="module", params=list(ACTION_SPACES))
def counting_model(request: pytest.FixtureRequest) -> AMAGO:
    env = PrevRewardWrapper(CountingEnv(action_space=ACTION_SPACES[request.param], random_length=True))
    return filled_model(env, steps=48)


def _loss_only(model: AMAGO, **weights: float) -> tuple[th.Tensor, dict]:
    cfg = LossConfig(**{"critic_weight": 0.0, "pg_weight": 0.0, "bc_weight": 0.0, **weights})
    model.policy.set_training_mode(True)
    model.policy.zero_grad(set_to_none=True)
    th.manual_seed(0)
    np.random.seed(0)
    batch = model.replay_buffer.sample(4)
    loss, stats = loss_of(model.policy, batch, cfg)
    loss.backward()
    return loss, stats


def _grad_norm(module: th.nn.Module) -> float:
    return sum(float(p.grad.abs().sum()) for p in module.parameters() if p.grad is not None)


@pytest.mark.parametrize(
    ("term", "reached", "untouched"),
    [
        ("pg_weight", ("actor", "traj_encoder", "timestep_encoder"), ("critics", "popart")),
        ("critic_weight", ("critics", "traj_encoder"), ("actor",)),
        ("bc_weight", ("actor", "traj_encoder", "timestep_encoder"), ("critics", "popart")),
    ],
)
def test_each_loss_term_reaches_only_its_networks(
    counting_model: AMAGO, term: str, reached: tuple[str, ...], untouched: tuple[str, ...]
) -> None:
    """One term alone (policy gradient, critic regression, behaviour cloning) gives nonzero gradients
    to the networks it trains and none to the others."""
    policy = counting_model.policy
    _, stats = _loss_only(counting_model, **{term: 1.0})
    if term == "bc_weight":
        assert stats["filter_pass_rate"] > 0, "the filter must let some buffer actions through for the term to act"
    for name in reached:
        assert _grad_norm(getattr(policy, name)) > 0.0, name
    for name in untouched:
        assert _grad_norm(getattr(policy, name)) == 0.0, name


def test_padding_positions_do_not_change_the_loss(counting_model: AMAGO) -> None:
    policy = counting_model.policy
    policy.set_training_mode(False)  # no dropout, no running-stat updates
    np.random.seed(3)
    batch = counting_model.replay_buffer.sample(4)
    assert not bool(batch.real.all()), "the batch should contain padding (rollouts of different lengths are cut)"
    noisy = batch._replace(
        rewards=th.where(batch.real, batch.rewards, th.full_like(batch.rewards, 1e6)),
        terminated=th.where(batch.real, batch.terminated, th.ones_like(batch.terminated)),
    )
    cfg = LossConfig()
    state = {k: v.clone() for k, v in policy.popart.state_dict().items()}
    th.manual_seed(0)
    loss_a, _ = loss_of(policy, batch, cfg)
    policy.popart.load_state_dict(state)
    th.manual_seed(0)
    loss_b, _ = loss_of(policy, noisy, cfg)
    policy.popart.load_state_dict(state)
    assert loss_a.item() == pytest.approx(loss_b.item(), rel=1e-6)


def test_discrete_critic_expectation_is_exact() -> None:
    policy = filled_model(PrevRewardWrapper(CountingEnv()), steps=8).policy
    state = th.randn(2, 3, policy.traj_encoder.out_dim, device=policy.device)
    probs = th.softmax(th.randn(2, 3, len(policy.gammas), 3, device=policy.device), -1)
    q_all = policy.critics(state)  # (B, L, C, G, n)
    expected = (q_all * probs.unsqueeze(2)).sum(-1)
    th.testing.assert_close(policy.action_type.critic_values(policy.critics, state, probs), expected)
    buffer_action = th.tensor([[[0.0], [2.0], [1.0]], [[1.0], [1.0], [0.0]]])
    q_buf, q_pi = policy.action_type.buffer_and_policy_values(policy.critics, state, buffer_action, probs)
    th.testing.assert_close(q_buf[1, 0], q_all[1, 0, :, :, 1])
    th.testing.assert_close(q_buf[0, 1], q_all[0, 1, :, :, 2])
    th.testing.assert_close(q_pi, expected)
