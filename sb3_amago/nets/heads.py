"""Actor and critic heads that sit on top of the shared trajectory encoder.

``G`` is the number of discount factors, ``C`` the number of critics, ``A`` the width of an encoded
action (number of actions for Discrete, action dimension for Box, sum of the choices for
MultiDiscrete). What depends on the action space lives in :mod:`sb3_amago.distributions`.
"""

import abc
import itertools
import math
from typing import TYPE_CHECKING, Any

import torch as th
from torch import nn

from sb3_amago.nets.activations import LeakyReLU, linear_leaky_relu
from sb3_amago.nets.cpu_matmul import Linear, ensemble_linear

if TYPE_CHECKING:
    from sb3_amago.distributions import ActionType


def symlog(x: th.Tensor) -> th.Tensor:
    return th.sign(x) * th.log1p(x.abs())


def gamma_features(gammas: th.Tensor) -> th.Tensor:
    """``(G,)`` -> ``(G, 1)``: symlog of the effective horizon ``1 / (1 - gamma)``."""
    return symlog(1.0 / (1.0 - gammas)).unsqueeze(-1)


def full_precision(out: th.Tensor, net: nn.Sequential) -> th.Tensor:
    """``out`` in the dtype of ``net``'s parameters. Under mixed precision a head's products run in
    bf16; what the loss computes from its outputs (softmax, PopArt, TD targets, their sums) runs in
    full precision, where bf16's 8-bit mantissa would round a discount of 0.999 to 1."""
    weight = net[-1].weight
    assert isinstance(weight, th.Tensor)
    return out.to(weight.dtype)


class EnsembleLinear(nn.Module):
    """``C`` independent linear layers applied in one batched matmul: ``(C, N, i) -> (C, N, o)``."""

    def __init__(self, n_members: int, in_features: int, out_features: int) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(in_features)
        self.weight = nn.Parameter(th.empty(n_members, in_features, out_features).uniform_(-bound, bound))
        self.bias = nn.Parameter(th.empty(n_members, 1, out_features).uniform_(-bound, bound))

    def forward(self, x: th.Tensor) -> th.Tensor:
        return ensemble_linear(x, self.weight, self.bias)


class MLP(nn.Sequential):
    """Linear layers (:class:`~sb3_amago.nets.cpu_matmul.Linear` or :class:`EnsembleLinear`), each but
    the last followed by a :class:`LeakyReLU` (or a slice of such): ``nn.Sequential``'s modules and
    state dict, with each layer and the rectifier after it run as
    :func:`~sb3_amago.nets.activations.linear_leaky_relu` (the rectifier in place on the product's output)."""

    def forward(self, x: th.Tensor) -> th.Tensor:
        layers, i = list(self), 0
        while i < len(layers):
            layer, after = layers[i], layers[i + 1] if i + 1 < len(layers) else None
            if isinstance(layer, (Linear, EnsembleLinear)) and isinstance(after, LeakyReLU):
                ensemble = isinstance(layer, EnsembleLinear)
                x = linear_leaky_relu(x, layer.weight, layer.bias, after.negative_slope, ensemble=ensemble)
                i += 2
            else:
                x = layer(x)
                i += 1
        return x


def mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int, n_members: int | None = None) -> MLP:
    """A leaky-ReLU MLP; with ``n_members`` it is an ensemble of that many MLPs run in one pass."""
    sizes = (in_dim, *hidden, out_dim)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(Linear(a, b) if n_members is None else EnsembleLinear(n_members, a, b))
        if i < len(sizes) - 2:
            layers.append(LeakyReLU())
    return MLP(*layers)


class ActorHead(nn.Module):
    """One action distribution per discount factor: an MLP whose output layer the action type reads.

    ``forward`` maps states ``(..., D)`` to the action type's actor output (see
    :mod:`sb3_amago.distributions`): ``CategoricalOutput(probs, logits)`` for Discrete and
    MultiDiscrete, ``(mean, log_std)``, each ``(..., G, A)``, for Box.
    """

    def __init__(self, state_dim: int, action_type: "ActionType", n_gammas: int, hidden: tuple[int, ...] = (256, 256)):
        super().__init__()
        self.action_type = action_type
        self.n_gammas = n_gammas
        self.net = mlp(state_dim, hidden, n_gammas * action_type.actor_output_dim)

    def forward(self, state: th.Tensor) -> Any:
        raw = full_precision(self.net(state), self.net).view(
            *state.shape[:-1], self.n_gammas, self.action_type.actor_output_dim
        )
        return self.action_type.actor_output(raw)


class CriticEnsemble(nn.Module, abc.ABC):
    """``C`` critics, each with one output per discount factor, run as one batched module.

    :param state_dim: ``D``
    :param encoded_dim: ``A``, the width of an encoded action (the number of actions for Discrete)
    :param gammas: ``(G,)`` the discount factors
    """

    gamma_feat: th.Tensor

    def __init__(
        self, state_dim: int, encoded_dim: int, gammas: th.Tensor, n_critics: int = 4, hidden: tuple[int, ...] = (256, 256)
    ) -> None:
        super().__init__()
        self.n_critics = n_critics
        self.n_gammas = len(gammas)
        self.encoded_dim = encoded_dim
        self.register_buffer("gamma_feat", gamma_features(gammas.float()))  # (G, 1)
        self.net = self._make_net(state_dim, hidden)

    @abc.abstractmethod
    def _make_net(self, state_dim: int, hidden: tuple[int, ...]) -> nn.Sequential:
        """The ensemble's MLP (built after ``gamma_feat``, so parameters initialise in a fixed order)."""


class EveryActionCritics(CriticEnsemble):
    """Discrete critics: ``forward(state (..., D))`` -> raw values of every action ``(..., C, G, n)``."""

    def _make_net(self, state_dim: int, hidden: tuple[int, ...]) -> nn.Sequential:
        return mlp(state_dim, hidden, self.n_gammas * self.encoded_dim, n_members=self.n_critics)

    def forward(self, state: th.Tensor) -> th.Tensor:
        lead = state.shape[:-1]
        x = state.reshape(1, -1, state.shape[-1]).expand(self.n_critics, -1, -1)
        out = full_precision(self.net(x), self.net).view(self.n_critics, *lead, self.n_gammas, self.encoded_dim)
        return out.movedim(0, -3)  # (..., C, G, n)


class ActionInputCritics(CriticEnsemble):
    """Box / MultiDiscrete critics: ``forward(state (..., D), action (..., G, A))`` -> ``(..., C, G)``;
    the input of each (critic, gamma) is ``[state, symlog(1 / (1 - gamma)), encoded action]``.

    The first layer is linear, so it runs on the state once per step and on the ``1 + A`` features of
    each gamma apart, and the two are summed: the same layer as on the concatenated input, without
    its ``G``-fold copies of the state (its largest input by far)."""

    def _make_net(self, state_dim: int, hidden: tuple[int, ...]) -> nn.Sequential:
        return mlp(state_dim + 1 + self.encoded_dim, hidden, 1, n_members=self.n_critics)

    def forward(self, state: th.Tensor, action: th.Tensor) -> th.Tensor:
        lead, d_state = state.shape[:-1], state.shape[-1]
        first, rest = self.net[0], self.net[1:]
        assert isinstance(first, EnsembleLinear)
        per_step = ensemble_linear(
            state.reshape(1, -1, d_state).expand(self.n_critics, -1, -1), first.weight[:, :d_state], first.bias
        )
        gfeat = self.gamma_feat.to(state.dtype).expand(*lead, self.n_gammas, 1)
        per_gamma = th.cat([gfeat, action], dim=-1).reshape(1, -1, 1 + self.encoded_dim)  # (1, N * G, 1 + A)
        per_gamma = ensemble_linear(per_gamma.expand(self.n_critics, -1, -1), first.weight[:, d_state:])  # (C, N * G, H)
        hidden = per_step.unsqueeze(2) + per_gamma.view(self.n_critics, -1, self.n_gammas, per_gamma.shape[-1])
        out = rest(hidden.view(self.n_critics, -1, hidden.shape[-1]))
        out = full_precision(out, self.net).view(self.n_critics, *lead, self.n_gammas)
        return out.movedim(0, -2)  # (..., C, G)
