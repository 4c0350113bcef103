"""Action distributions of the actor heads, in the forms the loss needs.

Shapes: ``(B, L, G, ...)`` with ``G`` discount factors. The buffer stores actions as SB3 does:
Discrete as the index ``(..., 1)``, MultiDiscrete as indices ``(..., d)``, Box scaled to [-1, 1].

MultiDiscrete is factorised: the actor gives an independent categorical per sub-action, and the
critics take the concatenated one-hot vector as their action input (like a continuous action);
the policy-gradient term differentiates a sampled one-hot with the straight-through estimator.
"""

from typing import Any

import torch as th
from gymnasium import spaces
from torch.nn import functional as F

from sb3_amago.nets.heads import action_nvec

ATANH_EPS = 1e-6


def one_hot_actions(buffer_action: th.Tensor, space: spaces.Space) -> th.Tensor:
    """Discrete / MultiDiscrete indices ``(..., d)`` -> concatenated one-hots ``(..., sum(nvec))``."""
    idx = buffer_action.long()
    return th.cat([F.one_hot(idx[..., i], n).to(buffer_action.dtype) for i, n in enumerate(action_nvec(space))], dim=-1)


def critic_action_input(buffer_action: th.Tensor, space: spaces.Space, n_gammas: int) -> th.Tensor:
    """Buffer actions ``(B, L, d)`` -> the critics' action input ``(B, L, G, A)`` (Box, MultiDiscrete)."""
    action = one_hot_actions(buffer_action, space) if isinstance(space, spaces.MultiDiscrete) else buffer_action
    return action.unsqueeze(-2).expand(*action.shape[:-1], n_gammas, action.shape[-1])


def sample_policy_action(actor_out: Any, space: spaces.Space) -> th.Tensor:
    """A differentiable policy action ``(B, L, G, A)`` for the critics.

    Discrete: the probability vector (its expectation under the critic is exact); MultiDiscrete: a
    one-hot sample with straight-through gradients; Box: a reparameterised tanh-Gaussian sample.
    """
    if isinstance(space, spaces.Box):
        mean, log_std = actor_out
        return th.tanh(mean + log_std.exp() * th.randn_like(mean))
    if isinstance(space, spaces.Discrete):
        return actor_out
    parts = []
    for probs in actor_out.split(action_nvec(space), dim=-1):
        flat = probs.reshape(-1, probs.shape[-1])
        sample = F.one_hot(th.multinomial(flat, 1).squeeze(-1), probs.shape[-1]).view_as(probs).to(probs.dtype)
        parts.append(sample + probs - probs.detach())
    return th.cat(parts, dim=-1)


def log_prob(actor_out: Any, buffer_action: th.Tensor, space: spaces.Space) -> th.Tensor:
    """``log pi(a | s)`` of buffer actions ``(B, L, d)`` under every gamma's policy -> ``(B, L, G)``."""
    if isinstance(space, spaces.Box):
        mean, log_std = actor_out  # (B, L, G, A)
        action = buffer_action.unsqueeze(-2).clamp(-1 + ATANH_EPS, 1 - ATANH_EPS)
        pre_tanh = th.atanh(action)
        normal = th.distributions.Normal(mean, log_std.exp())
        return (normal.log_prob(pre_tanh) - th.log1p(-action.pow(2) + ATANH_EPS)).sum(-1)
    onehot = one_hot_actions(buffer_action, space).unsqueeze(-2)  # (B, L, 1, A)
    return (onehot * actor_out.log()).sum(-1)


def entropy(actor_out: Any, space: spaces.Space) -> th.Tensor:
    """Per-gamma policy entropy ``(B, L, G)`` (Box: of the Gaussian before tanh)."""
    if isinstance(space, spaces.Box):
        _, log_std = actor_out
        return (log_std + 0.5 * (1.0 + th.log(th.tensor(2 * th.pi)))).sum(-1)
    return -(actor_out * actor_out.log()).sum(-1)
