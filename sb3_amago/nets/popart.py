"""PopArt: per-gamma value normalisation that preserves outputs while its statistics move."""

from collections.abc import Callable
from typing import NamedTuple

import torch as th
from torch import nn


class PopArtStats(NamedTuple):
    """PopArt's statistics and output layer at one moment, each ``(G,)`` (``n_updates``: ``()``),
    and what reads them."""

    mu: th.Tensor
    nu: th.Tensor
    w: th.Tensor
    b: th.Tensor
    n_updates: th.Tensor

    @property
    def sigma(self) -> th.Tensor:
        """``(G,)`` standard deviation of the targets."""
        return (self.nu - self.mu**2).clamp(min=1e-4).sqrt()

    def normalize(self, raw_q: th.Tensor) -> th.Tensor:
        """Critic output in normalised units: ``w * q + b``; ``raw_q`` has gammas on its last axis."""
        return self.w * raw_q + self.b

    def denormalize(self, raw_q: th.Tensor) -> th.Tensor:
        """Critic output in return units: ``sigma * (w q + b) + mu``."""
        return self.sigma * self.normalize(raw_q) + self.mu

    def normalize_target(self, target: th.Tensor) -> th.Tensor:
        """``(y - mu) / sigma`` for targets with gammas on the last axis."""
        return (target - self.mu) / self.sigma


class PopArt(nn.Module):
    """Running mean/std of TD targets for each of ``G`` discount factors, and the affine output
    layer ``w * q + b`` that the critics' raw outputs pass through.

    The statistics follow targets with an exponential rate ``beta`` (bias-corrected, so the first
    update moves them to the first batch, or not, so they leave ``mu = 0``, ``nu = init_nu`` slowly);
    each update rescales ``w`` and ``b`` so that the denormalised prediction ``sigma * (w q + b) + mu``
    is unchanged (van Hasselt et al., 2016).

    :param n_gammas: number of discount factors ``G``
    :param beta: statistics update rate
    :param init_nu: initial second moment
    :param trainable: ``w`` and ``b`` are parameters the optimizer trains too (else buffers that
        only the statistics update moves)
    :param bias_correction: correct the rate for the statistics' zero start
    """

    w: th.Tensor
    b: th.Tensor
    mu: th.Tensor
    nu: th.Tensor
    n_updates: th.Tensor

    def __init__(
        self, n_gammas: int, beta: float = 5e-4, init_nu: float = 100.0, trainable: bool = True, bias_correction: bool = True
    ) -> None:
        super().__init__()
        self.beta = beta
        self.bias_correction = bias_correction
        if trainable:
            self.w = nn.Parameter(th.ones(n_gammas))
            self.b = nn.Parameter(th.zeros(n_gammas))
        else:
            self.register_buffer("w", th.ones(n_gammas))
            self.register_buffer("b", th.zeros(n_gammas))
        self.register_buffer("mu", th.zeros(n_gammas))
        self.register_buffer("nu", th.full((n_gammas,), init_nu))
        # Number of updates so far, stored as a float so every state_dict entry is floating.
        self.register_buffer("n_updates", th.zeros(()))
        # Sums statistics over data-parallel ranks (set by sb3_amago.distributed; None in one process).
        self.reduce_moments: Callable[[th.Tensor], th.Tensor] | None = None

    def stats(self) -> PopArtStats:
        """The statistics and output layer as they are (the module's own tensors)."""
        return PopArtStats(self.mu, self.nu, self.w, self.b, self.n_updates)

    @property
    def sigma(self) -> th.Tensor:
        """``(G,)`` standard deviation of the targets."""
        return self.stats().sigma

    def near_constant_heads(self, max_cv: float = 0.05, scale_ratio: float = 10.0) -> list[int]:
        """Indices of the discount factors whose TD targets are nearly constant (std below ``max_cv``
        of the mean's magnitude) and whose output scale ``w`` has grown over ``scale_ratio`` times
        the median ``w`` as their std shrank. Such a head's normalised targets are mostly noise,
        amplified by ``w``: its errors then dominate the gradient of the critics' shared layers
        and its norm. A per-step reward that never changes (CartPole's +1) does this to short
        horizons, whose targets are then the same everywhere."""
        sigma, mu, w = self.sigma, self.mu, self.w.detach().abs()
        flat = (sigma < max_cv * mu.abs()) & (w > scale_ratio * w.median())
        return [int(i) for i in flat.nonzero().flatten()]

    def normalize(self, raw_q: th.Tensor) -> th.Tensor:
        """Critic output in normalised units: ``w * q + b``; ``raw_q`` has gammas on its last axis."""
        return self.stats().normalize(raw_q)

    def denormalize(self, raw_q: th.Tensor) -> th.Tensor:
        """Critic output in return units: ``sigma * (w q + b) + mu``."""
        return self.stats().denormalize(raw_q)

    def normalize_target(self, target: th.Tensor) -> th.Tensor:
        """``(y - mu) / sigma`` for targets with gammas on the last axis."""
        return self.stats().normalize_target(target)

    def update_stats(self, target: th.Tensor, real: th.Tensor) -> None:
        """Move the statistics towards the real targets, keeping outputs unchanged: :meth:`load` of
        :meth:`moved`."""
        self.load(self.moved(target, real))

    def moved(self, target: th.Tensor, real: th.Tensor) -> PopArtStats:
        """The statistics after one move towards the real targets, and ``w``, ``b`` rescaled so that
        outputs stay unchanged; the module itself is left as it is (:meth:`load` writes them).

        Nothing here mutates a tensor or branches on one, so a compiled update computes the move in
        its graph. The returned ``w`` and ``b`` have the moved values, and where the module's are
        trained, their gradient flows to those parameters (a loss computed with them is the loss of
        the moved parameters). A batch without real targets moves nothing. With
        :attr:`reduce_moments` set, the count and sums ``(1 + 2G,)`` are summed over the
        data-parallel ranks first, so that every rank moves by all ranks' targets.

        :param target: ``(..., G)`` TD targets
        :param real: ``(...)`` bool, which targets count
        """
        with th.no_grad():
            weights = real.to(target.dtype).unsqueeze(-1)  # (..., 1)
            dims = tuple(range(target.ndim - 1))
            moments = th.cat([weights.sum().reshape(1), (target * weights).sum(dims), (target**2 * weights).sum(dims)])
            if self.reduce_moments is not None:
                moments = self.reduce_moments(moments)
            count, total, total_sq = moments.split([1, self.mu.numel(), self.mu.numel()])
            seen = count > 0  # (1,)
            n_updates = self.n_updates + seen.squeeze(0).to(self.n_updates.dtype)
            # Bias correction in float64: in float32, 1 - (1 - beta) loses the digits that matter.
            rate = self.beta / (1.0 - (1.0 - self.beta) ** n_updates.double()) if self.bias_correction else self.beta
            old_sigma = self.sigma
            mu = (self.mu * (1 - rate) + rate * (total / count)).where(seen, self.mu)
            nu = (self.nu * (1 - rate) + rate * (total_sq / count)).where(seen, self.nu)
            new_sigma = PopArtStats(mu, nu, self.w, self.b, n_updates).sigma
            w = (self.w * (old_sigma / new_sigma)).where(seen, self.w)
            b = ((self.b * old_sigma + (self.mu - mu)) / new_sigma).where(seen, self.b)
        if self.w.requires_grad:  # the moved values, with the parameters' gradient
            w, b = w + (self.w - self.w.detach()), b + (self.b - self.b.detach())
        return PopArtStats(mu, nu, w, b, n_updates)

    @th.no_grad()
    def load(self, stats: PopArtStats) -> None:
        """Write ``stats`` (from :meth:`moved`) into the module."""
        for mine, value in zip(self.stats(), stats, strict=True):
            mine.copy_(value)
