"""Actor and critic heads that sit on top of the shared trajectory encoder.

``G`` is the number of discount factors, ``C`` the number of critics, ``A`` the action size
(number of actions for Discrete, action dimension for Box, sum of the choices for MultiDiscrete).
"""

import math

import numpy as np
import torch as th
from gymnasium import spaces
from torch import nn
from torch.nn import functional as F

PROB_MIN, PROB_MAX = 1e-3, 0.99
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def symlog(x: th.Tensor) -> th.Tensor:
    return th.sign(x) * th.log1p(x.abs())


def gamma_features(gammas: th.Tensor) -> th.Tensor:
    """``(G,)`` -> ``(G, 1)``: symlog of the effective horizon ``1 / (1 - gamma)``."""
    return symlog(1.0 / (1.0 - gammas)).unsqueeze(-1)


class EnsembleLinear(nn.Module):
    """``C`` independent linear layers applied in one batched matmul: ``(C, N, i) -> (C, N, o)``."""

    def __init__(self, n_members: int, in_features: int, out_features: int) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(in_features)
        self.weight = nn.Parameter(th.empty(n_members, in_features, out_features).uniform_(-bound, bound))
        self.bias = nn.Parameter(th.empty(n_members, 1, out_features).uniform_(-bound, bound))

    def forward(self, x: th.Tensor) -> th.Tensor:
        return th.baddbmm(self.bias, x, self.weight)


def mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int, n_members: int | None = None) -> nn.Sequential:
    """A leaky-ReLU MLP; with ``n_members`` it is an ensemble of that many MLPs run in one pass."""
    sizes = (in_dim, *hidden, out_dim)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b) if n_members is None else EnsembleLinear(n_members, a, b))
        if i < len(sizes) - 2:
            layers.append(nn.LeakyReLU())
    return nn.Sequential(*layers)


def action_size(action_space: spaces.Space) -> int:
    """``A``: the width of one action's one-hot / continuous encoding."""
    if isinstance(action_space, spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, spaces.MultiDiscrete):
        return int(np.sum(action_space.nvec))
    if isinstance(action_space, spaces.Box):
        return int(np.prod(action_space.shape))
    raise ValueError(
        f"AMAGO supports Discrete, MultiDiscrete and Box action spaces, got {action_space}. "
        "Wrap the env to expose one of these (e.g. flatten a Tuple of Discretes into MultiDiscrete)."
    )


def action_nvec(action_space: spaces.Space) -> list[int]:
    """Number of choices of each sub-action: ``[n]`` for Discrete, ``nvec`` for MultiDiscrete."""
    if isinstance(action_space, spaces.Discrete):
        return [int(action_space.n)]
    return [int(n) for n in np.asarray(action_space.nvec).reshape(-1)]


def clamp_probs(probs: th.Tensor) -> th.Tensor:
    """Clamp probabilities to [0.001, 0.99] along the last axis and renormalise."""
    probs = probs.clamp(PROB_MIN, PROB_MAX)
    return probs / probs.sum(-1, keepdim=True)


class ActorHead(nn.Module):
    """One action distribution per discount factor.

    Output of ``forward`` for states ``(..., D)``:
      * Discrete: probabilities ``(..., G, n)`` (clamped, renormalised)
      * MultiDiscrete: probabilities per sub-action, concatenated ``(..., G, sum(nvec))``
      * Box: ``(mean, log_std)``, each ``(..., G, A)``; actions are ``tanh`` of a Gaussian sample
    """

    def __init__(self, state_dim: int, action_space: spaces.Space, n_gammas: int, hidden: tuple[int, ...] = (256, 256)):
        super().__init__()
        self.action_space = action_space
        self.n_gammas = n_gammas
        self.action_dim = action_size(action_space)
        self.continuous = isinstance(action_space, spaces.Box)
        out = n_gammas * self.action_dim * (2 if self.continuous else 1)
        self.net = mlp(state_dim, hidden, out)
        self.nvec = action_nvec(action_space) if isinstance(action_space, spaces.MultiDiscrete) else None

    def forward(self, state: th.Tensor) -> th.Tensor | tuple[th.Tensor, th.Tensor]:
        out = self.net(state)
        if self.continuous:
            out = out.view(*state.shape[:-1], self.n_gammas, 2, self.action_dim)
            mean, log_std = out.unbind(-2)
            return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        logits = out.view(*state.shape[:-1], self.n_gammas, self.action_dim)
        if self.nvec is None:
            return clamp_probs(F.softmax(logits, dim=-1))
        return th.cat([clamp_probs(F.softmax(part, dim=-1)) for part in logits.split(self.nvec, dim=-1)], dim=-1)


class CriticEnsemble(nn.Module):
    """``C`` critics, each with one output per discount factor, run as one batched module.

    * Discrete: ``forward(state (..., D))`` -> raw values of every action ``(..., C, G, n)``.
    * Box / MultiDiscrete: ``forward(state (..., D), action (..., G, A))`` -> ``(..., C, G)``; the
      input of each (critic, gamma) is ``[state, symlog(1 / (1 - gamma)), action]``.
    """

    def __init__(
        self,
        state_dim: int,
        action_space: spaces.Space,
        gammas: th.Tensor,
        n_critics: int = 4,
        hidden: tuple[int, ...] = (256, 256),
    ) -> None:
        super().__init__()
        self.n_critics = n_critics
        self.n_gammas = len(gammas)
        self.action_dim = action_size(action_space)
        self.discrete = isinstance(action_space, spaces.Discrete)
        self.register_buffer("gamma_feat", gamma_features(gammas.float()))  # (G, 1)
        if self.discrete:
            self.net = mlp(state_dim, hidden, self.n_gammas * self.action_dim, n_members=n_critics)
        else:
            self.net = mlp(state_dim + 1 + self.action_dim, hidden, 1, n_members=n_critics)

    def forward(self, state: th.Tensor, action: th.Tensor | None = None) -> th.Tensor:
        lead = state.shape[:-1]
        if self.discrete:
            x = state.reshape(1, -1, state.shape[-1]).expand(self.n_critics, -1, -1)
            out = self.net(x).view(self.n_critics, *lead, self.n_gammas, self.action_dim)
            return out.movedim(0, -3)  # (..., C, G, n)
        assert action is not None, "continuous and MultiDiscrete critics need an action input"
        tiled = state.unsqueeze(-2).expand(*lead, self.n_gammas, state.shape[-1])  # (..., G, D)
        gfeat = self.gamma_feat.to(state.dtype).expand(*lead, self.n_gammas, 1)
        x = th.cat([tiled, gfeat, action], dim=-1).reshape(1, -1, tiled.shape[-1] + 1 + self.action_dim)
        out = self.net(x.expand(self.n_critics, -1, -1)).view(self.n_critics, *lead, self.n_gammas)
        return out.movedim(0, -2)  # (..., C, G)
