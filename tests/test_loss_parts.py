"""Hand checks of the loss's building blocks: PopArt, the random critic pair, masks."""

import torch as th

from sb3_amago.loss import masked_mean, pick_critics
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


def test_pick_critics_draws_with_replacement_per_position() -> None:
    B, L, C, G = 2, 3, 4, 5
    q = th.randn(B, L, C, G)
    th.manual_seed(123)
    got_min = pick_critics(q, 2, reduce_min=True)
    th.manual_seed(123)
    idx = th.randint(C, (B, L, 2, G))
    for b in range(B):
        for t in range(L):
            for g in range(G):
                i, j = idx[b, t, 0, g], idx[b, t, 1, g]
                assert got_min[b, t, g] == min(q[b, t, i, g], q[b, t, j, g])
    th.manual_seed(123)
    got_mean = pick_critics(q, 2, reduce_min=False)
    th.testing.assert_close(got_mean[1, 2, 3], (q[1, 2, idx[1, 2, 0, 3], 3] + q[1, 2, idx[1, 2, 1, 3], 3]) / 2)
    # With replacement: over many draws the same critic is picked twice somewhere.
    th.manual_seed(0)
    many = th.randint(C, (1000, 2))
    assert bool((many[:, 0] == many[:, 1]).any())


def test_masked_mean_ignores_masked_positions_and_broadcasts() -> None:
    x = th.tensor([[[1.0, 3.0], [100.0, 100.0]], [[5.0, 7.0], [9.0, 11.0]]])  # (B=2, L=2, G=2)
    mask = th.tensor([[True, False], [True, True]])
    assert masked_mean(x, mask).item() == (1 + 3 + 5 + 7 + 9 + 11) / 6
