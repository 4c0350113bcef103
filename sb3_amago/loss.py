"""AMAGO's single training loss: multi-gamma critic regression with PopArt, the policy-gradient
term through frozen critics, and filtered behaviour cloning, over one shared sequence model; and
pure behaviour cloning (``pure_bc``), the offline-RL baseline, in its place.

Shapes: ``B`` windows of ``L + 1`` steps; the loss lives on the first ``L`` positions and
bootstraps from the next one. ``C`` critics, ``G`` discount factors (main gamma last).
"""

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch as th

from sb3_amago.nets.popart import PopArtStats
from sb3_amago.policies import TransformerPolicy
from sb3_amago.type_aliases import TrajectoryBatch


@dataclass(frozen=True)
class LossConfig:
    """Weights and options of the loss (paper defaults). The one place they are defined: AMAGO's
    arguments of the same names take their defaults from here, and :meth:`from_settings` reads them
    back from its attributes.

    :param reward_multiplier: ``k``, rewards are scaled by it in the TD target
    :param critic_weight: weight of the critic regression
    :param pg_weight: weight of the policy-gradient ("online") term; 0 turns the TD target's
        min over critics into a mean
    :param bc_weight: weight of the filtered behaviour-cloning ("offline") term
    :param n_target_critics: critics drawn with replacement per (batch, time, gamma) for the target
    :param filter_kind: "binary" (1[A > 0]) or "exp" (exp(beta A) clipped)
    :param filter_beta: temperature of the "exp" filter
    :param filter_clip: upper clip of the "exp" filter
    :param n_step: TD targets over ``n`` steps of rewards before bootstrapping (within the sampled
        window: fewer where the window or the rollout ends first); 1 is the one-step target
    :param pure_bc: train by behaviour cloning alone: the mean log-likelihood of every buffer action,
        weight 1, no critic regression, no policy gradient (the weights above and the filter are unused)
    """

    reward_multiplier: float = 10.0
    critic_weight: float = 10.0
    pg_weight: float = 1.0
    bc_weight: float = 0.1
    n_target_critics: int = 2
    filter_kind: str = "binary"
    filter_beta: float = 1.0
    filter_clip: float = 100.0
    n_step: int = 1
    pure_bc: bool = False

    def __post_init__(self) -> None:
        if self.filter_kind not in ("binary", "exp"):
            raise ValueError(f"filter_kind must be 'binary' or 'exp', got {self.filter_kind!r}")
        if self.n_target_critics < 1:
            raise ValueError(f"n_target_critics must be >= 1, got {self.n_target_critics}")
        if int(self.n_step) != self.n_step or self.n_step < 1:
            raise ValueError(f"n_step must be an integer >= 1 (1: one-step TD targets), got {self.n_step}")

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> "LossConfig":
        """The config of the loss settings in ``settings`` (e.g. a model's attributes), by field name."""
        return cls(**{f.name: settings[f.name] for f in fields(cls)})


#: The defaults of the loss settings.
LOSS_DEFAULTS = LossConfig()


def masked_mean(x: th.Tensor, real: th.Tensor) -> th.Tensor:
    """Mean of ``x`` over the real positions ``real`` ``(B, L)``; trailing axes are averaged too."""
    m = real.to(x.dtype).view(*real.shape, *([1] * (x.ndim - real.ndim))).expand_as(x)
    return (x * m).sum() / m.sum().clamp(min=1.0)


def pick_critics(q: th.Tensor, n: int, reduce_min: bool) -> th.Tensor:
    """``(B, L, C, G)`` -> ``(B, L, G)``: draw ``n`` critic indices with replacement independently
    per (b, t, g) and take their min (or mean)."""
    B, L, C, G = q.shape
    idx = th.randint(C, (B, L, n, G), device=q.device)
    chosen = q.gather(2, idx)  # (B, L, n, G)
    return chosen.min(2).values if reduce_min else chosen.mean(2)


def td_target(
    q_next: th.Tensor,
    reward: th.Tensor,
    terminated: th.Tensor,
    gammas: th.Tensor,
    cfg: LossConfig,
    real_next: th.Tensor | None = None,
) -> th.Tensor:
    """``y = k r + gamma (1 - d) q`` per (b, t, g), with ``q`` the min (mean when the policy-gradient
    weight is 0) of ``cfg.n_target_critics`` critics drawn with replacement; with ``cfg.n_step`` > 1
    the n-step target of :func:`n_step_target`.

    :param q_next: ``(B, L, C, G)`` denormalised target-critic values at ``s_{t+1}``
    :param reward: ``(B, L)`` reward received on arriving at ``s_{t+1}``
    :param terminated: ``(B, L)`` 1 where ``s_{t+1}`` is terminal
    :param gammas: ``(G,)``
    :param real_next: ``(B, L)`` ``s_{t+1}`` is a real step (needed for ``n_step`` > 1)
    :return: ``(B, L, G)``
    """
    q = pick_critics(q_next, cfg.n_target_critics, reduce_min=cfg.pg_weight > 0)
    if cfg.n_step > 1:
        if real_next is None:
            raise ValueError("n-step targets need real_next, the real steps of the window")
        return n_step_target(q, reward, terminated, real_next, gammas, cfg.n_step, cfg.reward_multiplier)
    return cfg.reward_multiplier * reward.unsqueeze(-1) + gammas * (1.0 - terminated.unsqueeze(-1)) * q


def n_step_target(
    q: th.Tensor, reward: th.Tensor, terminated: th.Tensor, real_next: th.Tensor, gammas: th.Tensor, n: int, k: float
) -> th.Tensor:
    """The n-step TD target inside the window, per (b, t, g)::

        y_t = k * sum_{j < m} gamma^j r_{t+1+j}  +  gamma^m (1 - d_{t+m}) q(s_{t+m}),   m = min(n, T_b - t)

    where ``T_b`` is the number of real next steps of window ``b`` (the real steps are a prefix, and
    a rollout's end, terminal or not, is its last real step): the sum stops at the window's end or
    the rollout's, and bootstraps from the last step it reached (not at all from a terminal one);
    an ``n`` longer than the window is the window's length.
    Positions without a real next step get a value that the loss masks out.

    :param q: ``(B, L, G)`` target values at ``s_{t+1}`` (index ``t`` holds ``q(s_{t+1})``)
    :param reward: ``(B, L)`` reward received on arriving at ``s_{t+1}``
    :param terminated: ``(B, L)`` 1 where ``s_{t+1}`` is terminal
    :param real_next: ``(B, L)`` ``s_{t+1}`` is a real step
    :param gammas: ``(G,)``
    :return: ``(B, L, G)``
    """
    B, L, G = q.shape
    n = min(n, L)  # no reward lies beyond the window
    position = th.arange(L, device=q.device)
    steps = (real_next.sum(1, keepdim=True) - position).clamp(1, n)  # (B, L): m
    # j < m is j < n on the rewards of real steps (a prefix), so the discounted sum is one
    # correlation of those rewards with the kernel gamma^j, j < n, per gamma; kept in full
    # precision (autocast would run the convolution in bf16).
    dtype = th.result_type(reward, gammas)
    real_reward = th.nn.functional.pad((reward * real_next).to(dtype).unsqueeze(1), (0, n - 1))  # (B, 1, L + n - 1)
    discounts = gammas.to(dtype).unsqueeze(-1) ** th.arange(n, device=q.device, dtype=dtype)  # (G, n)
    with th.autocast(q.device.type, enabled=False):
        returns = th.nn.functional.conv1d(real_reward, discounts.unsqueeze(1)).transpose(1, 2)  # (B, L, G)
    last = (position + steps - 1).clamp(max=L - 1)  # index of q(s_{t+m})
    q_last = q.gather(1, last.unsqueeze(-1).expand(B, L, G))
    d_last = terminated.gather(1, last).unsqueeze(-1)
    return k * returns + gammas ** steps.unsqueeze(-1).to(q.dtype) * (1.0 - d_last) * q_last


def bc_filter(advantage: th.Tensor, cfg: LossConfig) -> th.Tensor:
    """Weight of each buffer action in the behaviour-cloning term: ``1[A > 0]`` or ``min(exp(beta A), clip)``."""
    if cfg.filter_kind == "binary":
        return (advantage > 0).to(advantage.dtype)
    return (cfg.filter_beta * advantage).exp().clamp(max=cfg.filter_clip)


def target_values(policy: TransformerPolicy, batch: TrajectoryBatch, states: th.Tensor, cfg: LossConfig) -> th.Tensor:
    """The TD target ``(B, L, G)`` of every position, from the EMA target heads on the online
    encoder's next states (no gradients), denormalised with PopArt's current statistics.

    :param states: ``(B, L + 1, D)``, the encoder's output on the batch
    """
    actions = policy.action_type
    with th.no_grad():
        s_next = states[:, 1:].detach()
        next_action = actions.policy_action(policy.actor_target(s_next))
        q_next = policy.popart.denormalize(actions.critic_values(policy.critics_target, s_next, next_action))  # (B, L, C, G)
        gammas = policy.gamma_values.to(q_next.dtype)  # (G,) in the heads' full precision, never bf16
        return td_target(q_next, batch.rewards[:, 1:], batch.terminated[:, 1:], gammas, cfg, batch.real[:, 1:])


def update_forward(
    policy: TransformerPolicy, batch: TrajectoryBatch, cfg: LossConfig
) -> tuple[th.Tensor, dict[str, Any], PopArtStats | None]:
    """One update's forward, every step in the open: the encoder once over the batch, the TD target,
    PopArt's move towards it and the loss with the moved statistics (:func:`amago_loss`); with
    ``pure_bc``, the encoder and :func:`behaviour_cloning_loss`. Returns the loss, the statistics
    to log and PopArt's moved statistics (``None`` with ``pure_bc``), which the training step
    writes into ``policy.popart`` after the backward pass: nothing here updates a parameter in
    place (the encoder's observation norms move their buffers, as before), so ``compile_model``
    compiles it as one graph."""
    states = policy.encode(batch.observations, batch.prev_actions, batch.time_idx, batch.real)  # (B, L + 1, D)
    if cfg.pure_bc:
        loss, stats = behaviour_cloning_loss(policy, batch, states)
        return loss, stats, None
    target = target_values(policy, batch, states, cfg)  # (B, L, G)
    popart = policy.popart.moved(target, batch.real[:, 1:])
    loss, stats = amago_loss(policy, batch, states, target, cfg, popart)
    return loss, stats, popart


def amago_loss(
    policy: TransformerPolicy,
    batch: TrajectoryBatch,
    states: th.Tensor,
    target: th.Tensor,
    cfg: LossConfig,
    popart: PopArtStats | None = None,
) -> tuple[th.Tensor, dict[str, Any]]:
    """One scalar loss for the whole agent, and the statistics to log.

    A free function of the policy and the batch (:func:`update_forward` shows where it sits in an
    update). It changes nothing, PopArt's statistics included.

    :param states: ``(B, L + 1, D)``, the encoder's output on the batch
    :param target: ``(B, L, G)`` from :func:`target_values`
    :param popart: PopArt's statistics to read, the update's moved ones (``PopArt.moved``); by
        default ``policy.popart``'s as they are
    """
    actions = policy.action_type
    s = states[:, :-1]
    real_next = batch.real[:, 1:]  # (B, L): the step after t is real
    a_buf = batch.actions[:, :-1]  # (B, L, d)
    popart = policy.popart.stats() if popart is None else popart

    # Critic values of the buffer actions (trained) and of the policy's actions through frozen
    # critics on detached states (the policy-gradient path trains only the actor and, through the
    # actor's input, the encoder).
    actor_out = policy.actor(s)
    pi_action = actions.policy_action(actor_out)
    q_buf_raw, q_pi = actions.buffer_and_policy_values(policy.critics, s, a_buf, pi_action)  # (B, L, C, G) each

    # Critic regression in PopArt-normalised units.
    q_buf = popart.normalize(q_buf_raw)
    critic_loss = masked_mean((q_buf - popart.normalize_target(target).unsqueeze(-2)) ** 2, real_next)

    w, b = popart.w.detach(), popart.b.detach()
    pg_loss = -masked_mean(w * q_pi.min(2).values + b, real_next)

    # Filtered behaviour cloning: imitate buffer actions that the critics rate above the policy's.
    with th.no_grad():
        weight = bc_filter(q_buf.mean(2) - (w * q_pi + b).mean(2), cfg)  # (B, L, G)
    bc_loss = -masked_mean(weight * actions.log_prob(actor_out, a_buf), real_next)

    loss = cfg.critic_weight * critic_loss + cfg.pg_weight * pg_loss + cfg.bc_weight * bc_loss
    with th.no_grad():
        q_denorm = (popart.sigma * q_buf + popart.mu).mean(2)  # (B, L, G), in return units
        stats = {
            "critic_loss": critic_loss.detach(),
            "actor_loss": pg_loss.detach(),
            "bc_loss": bc_loss.detach(),
            "filter_pass_rate": masked_mean(weight, real_next),
            "entropy": masked_mean(actions.entropy(actor_out)[..., -1], real_next),
            "q_mean": _per_gamma_mean(q_denorm, real_next),
        }
    return loss, stats


def behaviour_cloning_loss(
    policy: TransformerPolicy, batch: TrajectoryBatch, states: th.Tensor
) -> tuple[th.Tensor, dict[str, Any]]:
    """Pure behaviour cloning (``LossConfig.pure_bc``): minus the mean log-likelihood of every buffer
    action under the actor (every gamma head), over the positions whose next step is real; and the
    statistics to log. No critic or target is involved.

    :param states: ``(B, L + 1, D)``, the encoder's output on the batch
    """
    actions = policy.action_type
    real_next = batch.real[:, 1:]
    actor_out = policy.actor(states[:, :-1])
    bc_loss = -masked_mean(actions.log_prob(actor_out, batch.actions[:, :-1]), real_next)
    with th.no_grad():
        stats = {"bc_loss": bc_loss.detach(), "entropy": masked_mean(actions.entropy(actor_out)[..., -1], real_next)}
    return bc_loss, stats


def _per_gamma_mean(x: th.Tensor, real: th.Tensor) -> th.Tensor:
    """``(B, L, G)`` -> ``(G,)`` mean per gamma over the real positions ``real`` ``(B, L)``."""
    m = real.to(x.dtype).unsqueeze(-1)
    return (x * m).sum((0, 1)) / m.sum().clamp(min=1.0)
