"""AMAGO's single training loss: multi-gamma critic regression with PopArt, the policy-gradient
term through frozen critics, and filtered behaviour cloning, over one shared sequence model.

Shapes: ``B`` windows of ``L + 1`` steps; the loss lives on the first ``L`` positions and
bootstraps from the next one. ``C`` critics, ``G`` discount factors (main gamma last).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch as th
from gymnasium import spaces
from torch.func import functional_call

from sb3_amago.distributions import critic_action_input, entropy, log_prob, sample_policy_action
from sb3_amago.nets.heads import CriticEnsemble
from sb3_amago.policies import TransformerPolicy
from sb3_amago.type_aliases import TrajectoryBatch


@dataclass(frozen=True)
class LossConfig:
    """Weights and options of the loss (paper defaults).

    :param reward_multiplier: ``k``, rewards are scaled by it in the TD target
    :param critic_weight: weight of the critic regression
    :param pg_weight: weight of the policy-gradient ("online") term; 0 turns the TD target's
        min over critics into a mean
    :param bc_weight: weight of the filtered behaviour-cloning ("offline") term
    :param n_target_critics: critics drawn with replacement per (batch, time, gamma) for the target
    :param filter_kind: "binary" (1[A > 0]) or "exp" (exp(beta A) clipped)
    :param filter_beta: temperature of the "exp" filter
    :param filter_clip: upper clip of the "exp" filter
    """

    reward_multiplier: float = 10.0
    critic_weight: float = 10.0
    pg_weight: float = 1.0
    bc_weight: float = 0.1
    n_target_critics: int = 2
    filter_kind: str = "binary"
    filter_beta: float = 1.0
    filter_clip: float = 100.0

    def __post_init__(self) -> None:
        if self.filter_kind not in ("binary", "exp"):
            raise ValueError(f"filter_kind must be 'binary' or 'exp', got {self.filter_kind!r}")
        if self.n_target_critics < 1:
            raise ValueError(f"n_target_critics must be >= 1, got {self.n_target_critics}")


def masked_mean(x: th.Tensor, mask: th.Tensor) -> th.Tensor:
    """Mean of ``x`` over positions where ``mask`` ``(B, L)`` holds; trailing axes are averaged too."""
    m = mask.to(x.dtype).view(*mask.shape, *([1] * (x.ndim - mask.ndim))).expand_as(x)
    return (x * m).sum() / m.sum().clamp(min=1.0)


def critic_values(critics: CriticEnsemble, state: th.Tensor, action: th.Tensor, space: spaces.Space, params: dict | None = None) -> th.Tensor:
    """Raw critic outputs ``(B, L, C, G)`` at policy actions ``(B, L, G, A)``.

    Discrete: ``action`` is the probability vector and the value its exact expectation.
    ``params`` runs the critics with other weights (e.g. detached copies).
    """
    run = critics if params is None else (lambda *args: functional_call(critics, params, args))
    if isinstance(space, spaces.Discrete):
        return (run(state) * action.unsqueeze(-3)).sum(-1)  # (B, L, C, G, n) -> (B, L, C, G)
    return run(state, action)


def buffer_and_policy_values(
    critics: CriticEnsemble, state: th.Tensor, buffer_action: th.Tensor, policy_action: th.Tensor, space: spaces.Space
) -> tuple[th.Tensor, th.Tensor]:
    """Raw ``Q(s, a_buffer)`` (gradients to critics and state) and ``Q_frozen(sg s, a_policy)``
    (gradients to the policy action only), each ``(B, L, C, G)``.

    Discrete critics output every action's value at once, so one forward serves both: the frozen
    values are that output detached.
    """
    if isinstance(space, spaces.Discrete):
        q_all = critics(state)  # (B, L, C, G, n)
        idx = buffer_action.long().unsqueeze(-2).unsqueeze(-2).expand(*q_all.shape[:-1], 1)
        return q_all.gather(-1, idx).squeeze(-1), (q_all.detach() * policy_action.unsqueeze(-3)).sum(-1)
    n_gammas = policy_action.shape[-2]
    q_buf = critics(state, critic_action_input(buffer_action, space, n_gammas))
    frozen = {name: p.detach() for name, p in critics.named_parameters()}
    frozen.update(dict(critics.named_buffers()))
    return q_buf, critic_values(critics, state.detach(), policy_action, space, params=frozen)


def pick_critics(q: th.Tensor, n: int, reduce_min: bool) -> th.Tensor:
    """``(B, L, C, G)`` -> ``(B, L, G)``: draw ``n`` critic indices with replacement independently
    per (b, t, g) and take their min (or mean)."""
    B, L, C, G = q.shape
    idx = th.randint(C, (B, L, n, G), device=q.device)
    chosen = q.gather(2, idx)  # (B, L, n, G)
    return chosen.min(2).values if reduce_min else chosen.mean(2)


def td_target(q_next: th.Tensor, reward: th.Tensor, terminated: th.Tensor, gammas: th.Tensor, cfg: LossConfig) -> th.Tensor:
    """``y = k r + gamma (1 - d) q`` per (b, t, g), with ``q`` the min (mean when the policy-gradient
    weight is 0) of ``cfg.n_target_critics`` critics drawn with replacement.

    :param q_next: ``(B, L, C, G)`` denormalised target-critic values at ``s_{t+1}``
    :param reward: ``(B, L)`` reward received on arriving at ``s_{t+1}``
    :param terminated: ``(B, L)`` 1 where ``s_{t+1}`` is terminal
    :param gammas: ``(G,)``
    :return: ``(B, L, G)``
    """
    q = pick_critics(q_next, cfg.n_target_critics, reduce_min=cfg.pg_weight > 0)
    return cfg.reward_multiplier * reward.unsqueeze(-1) + gammas * (1.0 - terminated.unsqueeze(-1)) * q


def bc_filter(advantage: th.Tensor, cfg: LossConfig) -> th.Tensor:
    """Weight of each buffer action in the behaviour-cloning term: ``1[A > 0]`` or ``min(exp(beta A), clip)``."""
    if cfg.filter_kind == "binary":
        return (advantage > 0).to(advantage.dtype)
    return (cfg.filter_beta * advantage).exp().clamp(max=cfg.filter_clip)


def amago_loss(
    policy: TransformerPolicy, batch: TrajectoryBatch, cfg: LossConfig, encode: Callable[..., th.Tensor] | None = None
) -> tuple[th.Tensor, dict[str, Any]]:
    """One scalar loss for the whole agent, and the statistics to log.

    :param encode: the (possibly compiled) ``policy.encode``
    """
    space = policy.action_space
    states = (encode or policy.encode)(batch.observations, batch.prev_actions, batch.time_idx, batch.mask)  # (B, L+1, D)
    s, s_next = states[:, :-1], states[:, 1:].detach()
    valid = batch.mask[:, 1:]  # (B, L): the step after t is real
    a_buf = batch.actions[:, :-1]  # (B, L, d)
    gammas = policy.gamma_values.to(states.dtype)  # (G,)
    popart = policy.popart

    # TD target from the EMA target heads on the online encoder's next states.
    with th.no_grad():
        next_action = sample_policy_action(policy.actor_target(s_next), space)
        q_next = popart.denormalize(critic_values(policy.critics_target, s_next, next_action, space))  # (B, L, C, G)
        target = td_target(q_next, batch.rewards[:, 1:], batch.terminated[:, 1:], gammas, cfg)  # (B, L, G)
    popart.update_stats(target, valid)

    # Critic values of the buffer actions (trained) and of the policy's actions through frozen
    # critics on detached states (the policy-gradient path trains only the actor and, through the
    # actor's input, the encoder).
    actor_out = policy.actor(s)
    pi_action = sample_policy_action(actor_out, space)
    q_buf_raw, q_pi = buffer_and_policy_values(policy.critics, s, a_buf, pi_action, space)  # (B, L, C, G) each

    # Critic regression in PopArt-normalised units.
    q_buf = popart.normalize(q_buf_raw)
    critic_loss = masked_mean((q_buf - popart.normalize_target(target).unsqueeze(-2)) ** 2, valid)

    w, b = popart.w.detach(), popart.b.detach()
    pg_loss = -masked_mean(w * q_pi.min(2).values + b, valid)

    # Filtered behaviour cloning: imitate buffer actions that the critics rate above the policy's.
    with th.no_grad():
        weight = bc_filter(q_buf.mean(2) - (w * q_pi + b).mean(2), cfg)  # (B, L, G)
    bc_loss = -masked_mean(weight * log_prob(actor_out, a_buf, space), valid)

    loss = cfg.critic_weight * critic_loss + cfg.pg_weight * pg_loss + cfg.bc_weight * bc_loss
    with th.no_grad():
        q_denorm = (popart.sigma * q_buf + popart.mu).mean(2)  # (B, L, G), in return units
        stats = {
            "critic_loss": critic_loss.detach(),
            "actor_loss": pg_loss.detach(),
            "bc_loss": bc_loss.detach(),
            "filter_pass_rate": masked_mean(weight, valid),
            "entropy": masked_mean(entropy(actor_out, space)[..., -1], valid),
            "q_mean": _per_gamma_mean(q_denorm, valid),
        }
    return loss, stats


def _per_gamma_mean(x: th.Tensor, mask: th.Tensor) -> th.Tensor:
    """``(B, L, G)`` -> ``(G,)`` masked mean per gamma."""
    m = mask.to(x.dtype).unsqueeze(-1)
    return (x * m).sum((0, 1)) / m.sum().clamp(min=1.0)
