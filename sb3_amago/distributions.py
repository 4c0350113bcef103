"""Everything that depends on the action space, one class per space, built by :func:`make_action_type`.

Each class owns, for its space:

* the buffer representation of an action, ``(..., action_dim)`` float with ``action_dim`` SB3's
  ``get_action_dim`` (Discrete: the index, MultiDiscrete: the indices, Box: scaled to [-1, 1]),
  and its conversion from and to what ``env.step`` takes;
* the encoding ``(..., encoded_dim)`` of an action as a network input (one-hot codes, or the
  scaled Box values), read by the timestep encoder (previous action) and the critics;
* the actor's output layer (raw outputs per discount factor -> the actor output), sampling,
  ``log pi``, entropy and exploration noise;
* the critics: their class (Discrete critics score every action at once, the others take the
  encoded action as input) and the values of buffer and policy actions.

Shapes: ``B`` windows of ``L`` steps, ``G`` discount factors, ``C`` critics, ``N`` envs,
``A = encoded_dim``. The actor output is a :class:`CategoricalOutput` (clamped probabilities and
the logits they come from, each ``(..., G, A)``) for the discrete spaces and a pair
``(mean, log_std)`` of ``(..., G, A)`` tensors for Box.
"""

import abc
import math
from typing import Any, NamedTuple

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.preprocessing import get_action_dim
from torch.func import functional_call
from torch.nn import functional as F

from sb3_amago.nets.heads import ActionInputCritics, CriticEnsemble, EveryActionCritics

#: The actor output: a :class:`CategoricalOutput`, or ``(mean, log_std)`` for Box.
ActorOutput = Any

PROB_MIN, PROB_MAX = 1e-3, 0.99
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
ATANH_EPS = 1e-6


def softmax_over_actions(logits: th.Tensor, log: bool = False) -> th.Tensor:
    """Softmax (``log``: log-softmax) over the last axis of ``(..., G, n)``, run over the
    second-to-last axis of the transposed ``(..., n, G)``: torch's CPU softmax over a last axis of a
    few actions is ~5x slower than over a leading one (equal to the direct one up to float32 rounding)."""
    softmax = F.log_softmax if log else F.softmax
    return softmax(logits.transpose(-1, -2).contiguous(), dim=-2).transpose(-1, -2).contiguous()


def clamp_probs(probs: th.Tensor) -> th.Tensor:
    """Clamp probabilities to [0.001, 0.99] along the last axis and renormalise."""
    probs = probs.clamp(PROB_MIN, PROB_MAX)
    return probs / probs.sum(-1, keepdim=True)


class ActionType(abc.ABC):
    """The action-space-specific parts of AMAGO for one action space (see the module docstring).

    :param space: the env's action space
    """

    def __init__(self, space: spaces.Space) -> None:
        self.space = space
        #: The env's shape of one action.
        self.shape: tuple[int, ...] = space.shape or ()
        #: Width of one action in the buffer (SB3's ``get_action_dim``).
        self.action_dim = get_action_dim(space)
        #: Width ``A`` of one encoded action (one-hot codes, or the Box values).
        self.encoded_dim = self.action_dim
        #: Whether SB3 should treat the policy's actions as squashed to [-1, 1] (Box).
        self.squash_output = False

    # -- actor ------------------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def actor_output_dim(self) -> int:
        """Raw actor outputs per discount factor."""

    @abc.abstractmethod
    def actor_output(self, raw: th.Tensor) -> ActorOutput:
        """Raw actor outputs ``(..., G, actor_output_dim)`` -> the actor output."""

    @abc.abstractmethod
    def select_gamma(self, actor_out: ActorOutput, index: int) -> ActorOutput:
        """The actor output of one discount factor: ``(..., G, A)`` -> ``(..., A)``."""

    @abc.abstractmethod
    def sample(self, actor_out: ActorOutput, deterministic: bool) -> th.Tensor:
        """Actions in the buffer representation ``(N, action_dim)`` for one discount factor's output ``(N, A)``."""

    @abc.abstractmethod
    def policy_action(self, actor_out: ActorOutput) -> th.Tensor:
        """A differentiable policy action ``(B, L, G, A)`` for the critics."""

    @abc.abstractmethod
    def log_prob(self, actor_out: ActorOutput, buffer_action: th.Tensor) -> th.Tensor:
        """``log pi(a | s)`` of buffer actions ``(B, L, action_dim)`` under every gamma's policy -> ``(B, L, G)``."""

    @abc.abstractmethod
    def entropy(self, actor_out: ActorOutput) -> th.Tensor:
        """Per-gamma policy entropy ``(B, L, G)``."""

    @abc.abstractmethod
    def explore(self, action: th.Tensor, eps: th.Tensor) -> th.Tensor:
        """Buffer actions ``(N, action_dim)`` with exploration of level ``eps`` ``(N, 1)`` per env."""

    # -- representations ----------------------------------------------------------------------
    @abc.abstractmethod
    def encode(self, buffer_action: th.Tensor) -> th.Tensor:
        """Buffer actions ``(..., action_dim)`` -> network inputs ``(..., A)`` in the same dtype."""

    @abc.abstractmethod
    def to_env(self, buffer_action: np.ndarray) -> np.ndarray:
        """Buffer actions ``(N, action_dim)`` -> what ``env.step`` of a VecEnv takes."""

    @abc.abstractmethod
    def to_buffer(self, env_action: np.ndarray) -> np.ndarray:
        """Env-format actions for ``N`` envs -> the buffer representation ``(N, action_dim)`` float32."""

    # -- critics ------------------------------------------------------------------------------
    def make_critics(self, state_dim: int, gammas: th.Tensor, n_critics: int, hidden: tuple[int, ...]) -> CriticEnsemble:
        """The critic ensemble: each critic takes ``[state, gamma feature, encoded action]``."""
        return ActionInputCritics(state_dim, self.encoded_dim, gammas, n_critics, hidden)

    def critic_values(
        self, critics: CriticEnsemble, state: th.Tensor, policy_action: th.Tensor, params: dict[str, th.Tensor] | None = None
    ) -> th.Tensor:
        """Raw critic outputs ``(B, L, C, G)`` at policy actions ``(B, L, G, A)``.

        ``params`` runs the critics with other weights (e.g. detached copies).
        """
        if params is None:
            return critics(state, policy_action)
        return functional_call(critics, params, (state, policy_action))

    def buffer_and_policy_values(
        self, critics: CriticEnsemble, state: th.Tensor, buffer_action: th.Tensor, policy_action: th.Tensor
    ) -> tuple[th.Tensor, th.Tensor]:
        """Raw ``Q(s, a_buffer)`` (gradients to critics and state) and ``Q_frozen(sg s, a_policy)``
        (gradients to the policy action only), each ``(B, L, C, G)``.

        :param buffer_action: ``(B, L, action_dim)``
        :param policy_action: ``(B, L, G, A)``
        """
        n_gammas = policy_action.shape[-2]
        encoded = self.encode(buffer_action)  # (B, L, A)
        q_buf = critics(state, encoded.unsqueeze(-2).expand(*encoded.shape[:-1], n_gammas, encoded.shape[-1]))
        frozen = {name: p.detach() for name, p in critics.named_parameters()}
        frozen.update(dict(critics.named_buffers()))
        return q_buf, self.critic_values(critics, state.detach(), policy_action, params=frozen)


class CategoricalOutput(NamedTuple):
    """The categorical actor's output, per discount factor.

    ``probs`` are what the agent acts with and what the policy-gradient term differentiates: the
    softmax of each sub-action's logits, clamped to [0.001, 0.99] and renormalised. The clamp has no
    gradient where it binds, so the log-likelihood of buffer actions (the behaviour-cloning terms)
    is the log-softmax of the ``logits`` instead: a buffer action the policy has pushed far below
    0.001 is still pulled back up (gradient ``1 - p`` on its logit), where ``log(probs)`` would give
    it none.
    """

    probs: th.Tensor  # (..., G, A)
    logits: th.Tensor  # (..., G, A)


class CategoricalAction(ActionType):
    """Discrete and MultiDiscrete: one categorical per sub-action, actions one-hot encoded.

    A MultiDiscrete policy is factorised (an independent categorical per sub-action); its critics
    take the concatenated one-hot action, and the policy-gradient term differentiates a sampled
    one-hot with the straight-through estimator.
    """

    def __init__(self, space: spaces.Space, nvec: list[int]) -> None:
        super().__init__(space)
        #: Number of choices of each sub-action.
        self.nvec = nvec
        self.encoded_dim = sum(nvec)

    @property
    def actor_output_dim(self) -> int:
        return self.encoded_dim

    def actor_output(self, raw: th.Tensor) -> CategoricalOutput:
        probs = th.cat([clamp_probs(softmax_over_actions(part)) for part in raw.split(self.nvec, dim=-1)], dim=-1)
        return CategoricalOutput(probs, raw)

    def select_gamma(self, actor_out: CategoricalOutput, index: int) -> CategoricalOutput:
        return CategoricalOutput(*(t[..., index, :] for t in actor_out))

    def sample(self, actor_out: CategoricalOutput, deterministic: bool) -> th.Tensor:
        picks = []
        for probs in actor_out.probs.split(self.nvec, dim=-1):
            picks.append(probs.argmax(-1) if deterministic else th.multinomial(probs, 1).squeeze(-1))
        return th.stack(picks, dim=-1).float()

    def policy_action(self, actor_out: CategoricalOutput) -> th.Tensor:
        """A one-hot sample per sub-action with straight-through gradients."""
        parts = []
        for probs in actor_out.probs.split(self.nvec, dim=-1):
            flat = probs.reshape(-1, probs.shape[-1])
            sample = F.one_hot(th.multinomial(flat, 1).squeeze(-1), probs.shape[-1]).view_as(probs).to(probs.dtype)
            parts.append(sample + probs - probs.detach())
        return th.cat(parts, dim=-1)

    def log_prob(self, actor_out: CategoricalOutput, buffer_action: th.Tensor) -> th.Tensor:
        """The log-softmax of the logits at the buffer action (see :class:`CategoricalOutput`), summed over sub-actions."""
        onehot = self.encode(buffer_action).unsqueeze(-2)  # (B, L, 1, A)
        log_probs = th.cat(
            [softmax_over_actions(part, log=True) for part in actor_out.logits.split(self.nvec, dim=-1)], dim=-1
        )
        return (onehot * log_probs).sum(-1)

    def entropy(self, actor_out: CategoricalOutput) -> th.Tensor:
        probs = actor_out.probs
        return -(probs * probs.log()).sum(-1)

    def explore(self, action: th.Tensor, eps: th.Tensor) -> th.Tensor:
        """Epsilon-greedy per sub-action: each is replaced by a uniform choice with probability ``eps``."""
        high = th.as_tensor(self.nvec, dtype=action.dtype, device=action.device)
        random_action = th.floor(th.rand_like(action) * high)
        return th.where(th.rand_like(action) < eps, random_action, action)

    def encode(self, buffer_action: th.Tensor) -> th.Tensor:
        """Indices ``(..., d)`` -> concatenated one-hots ``(..., sum(nvec))`` (indices clamped into range)."""
        idx = buffer_action.long()
        parts = [F.one_hot(idx[..., i].clamp(0, n - 1), n).to(buffer_action.dtype) for i, n in enumerate(self.nvec)]
        return th.cat(parts, dim=-1)

    def to_env(self, buffer_action: np.ndarray) -> np.ndarray:
        return buffer_action.astype(np.int64).reshape(-1, *self.shape)

    def to_buffer(self, env_action: np.ndarray) -> np.ndarray:
        return np.asarray(env_action, dtype=np.float32).reshape(len(env_action), -1)


class DiscreteAction(CategoricalAction):
    """Discrete: critics output one value per action, so expectations under the policy are exact."""

    def __init__(self, space: spaces.Discrete) -> None:
        super().__init__(space, [int(space.n)])

    def to_env(self, buffer_action: np.ndarray) -> np.ndarray:
        return buffer_action[:, 0].astype(np.int64)

    def policy_action(self, actor_out: CategoricalOutput) -> th.Tensor:
        """The probability vector itself: its value under the critics is the exact expectation."""
        return actor_out.probs

    def make_critics(self, state_dim: int, gammas: th.Tensor, n_critics: int, hidden: tuple[int, ...]) -> CriticEnsemble:
        """The critic ensemble: each critic maps a state to the value of every action."""
        return EveryActionCritics(state_dim, self.encoded_dim, gammas, n_critics, hidden)

    def critic_values(
        self, critics: CriticEnsemble, state: th.Tensor, policy_action: th.Tensor, params: dict[str, th.Tensor] | None = None
    ) -> th.Tensor:
        """The exact expectation of the critics' values under the policy's probabilities ``(B, L, G, n)``."""
        q_all = critics(state) if params is None else functional_call(critics, params, (state,))
        return (q_all * policy_action.unsqueeze(-3)).sum(-1)  # (B, L, C, G, n) -> (B, L, C, G)

    def buffer_and_policy_values(
        self, critics: CriticEnsemble, state: th.Tensor, buffer_action: th.Tensor, policy_action: th.Tensor
    ) -> tuple[th.Tensor, th.Tensor]:
        """One critic forward serves both: the frozen values are its output detached."""
        q_all = critics(state)  # (B, L, C, G, n)
        idx = buffer_action.long().unsqueeze(-2).unsqueeze(-2).expand(*q_all.shape[:-1], 1)
        return q_all.gather(-1, idx).squeeze(-1), (q_all.detach() * policy_action.unsqueeze(-3)).sum(-1)


class MultiDiscreteAction(CategoricalAction):
    """MultiDiscrete: a factorised policy, critics take the concatenated one-hot action."""

    def __init__(self, space: spaces.MultiDiscrete) -> None:
        super().__init__(space, [int(n) for n in np.asarray(space.nvec).reshape(-1)])


class TanhGaussianAction(ActionType):
    """Box: a Gaussian squashed by ``tanh`` into [-1, 1], rescaled to the space's bounds for the env.

    Float64 spaces get float64 actions.
    """

    def __init__(self, space: spaces.Box) -> None:
        super().__init__(space)
        self.low, self.high = space.low, space.high
        self.squash_output = True

    @property
    def actor_output_dim(self) -> int:
        return 2 * self.action_dim

    def actor_output(self, raw: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        mean, log_std = raw.view(*raw.shape[:-1], 2, self.action_dim).unbind(-2)
        return mean, log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)

    def select_gamma(self, actor_out: tuple[th.Tensor, th.Tensor], index: int) -> tuple[th.Tensor, th.Tensor]:
        mean, log_std = actor_out
        return mean[..., index, :], log_std[..., index, :]

    @staticmethod
    def _squashed_sample(mean: th.Tensor, log_std: th.Tensor) -> th.Tensor:
        """A reparameterised sample ``tanh(mean + std * noise)``."""
        return th.tanh(mean + log_std.exp() * th.randn_like(mean))

    def sample(self, actor_out: tuple[th.Tensor, th.Tensor], deterministic: bool) -> th.Tensor:
        mean, log_std = actor_out
        return th.tanh(mean) if deterministic else self._squashed_sample(mean, log_std)

    def policy_action(self, actor_out: tuple[th.Tensor, th.Tensor]) -> th.Tensor:
        return self._squashed_sample(*actor_out)

    def log_prob(self, actor_out: tuple[th.Tensor, th.Tensor], buffer_action: th.Tensor) -> th.Tensor:
        mean, log_std = actor_out  # (B, L, G, A)
        action = buffer_action.unsqueeze(-2).clamp(-1 + ATANH_EPS, 1 - ATANH_EPS)
        pre_tanh = th.atanh(action)
        normal = th.distributions.Normal(mean, log_std.exp())
        return (normal.log_prob(pre_tanh) - th.log1p(-action.pow(2) + ATANH_EPS)).sum(-1)

    def entropy(self, actor_out: tuple[th.Tensor, th.Tensor]) -> th.Tensor:
        """Entropy of the Gaussian before ``tanh``."""
        _, log_std = actor_out
        return (log_std + 0.5 * (1.0 + th.log(th.tensor(2 * math.pi)))).sum(-1)

    def explore(self, action: th.Tensor, eps: th.Tensor) -> th.Tensor:
        """Gaussian noise of std ``eps``, clamped to [-1, 1]."""
        return (action + eps * th.randn_like(action)).clamp(-1.0, 1.0)

    def encode(self, buffer_action: th.Tensor) -> th.Tensor:
        return buffer_action

    def to_env(self, buffer_action: np.ndarray) -> np.ndarray:
        scaled = buffer_action.astype(np.float64).reshape(-1, *self.shape)
        return (self.low + (0.5 * (scaled + 1.0) * (self.high - self.low))).astype(self.space.dtype)

    def to_buffer(self, env_action: np.ndarray) -> np.ndarray:
        scaled = 2.0 * ((env_action - self.low) / (self.high - self.low)) - 1.0
        return np.asarray(scaled, dtype=np.float32).reshape(len(env_action), -1)


def make_action_type(space: spaces.Space) -> ActionType:
    """The :class:`ActionType` of an action space.

    :raises ValueError: for spaces other than Discrete, MultiDiscrete and Box
    """
    if isinstance(space, spaces.Discrete):
        return DiscreteAction(space)
    if isinstance(space, spaces.MultiDiscrete):
        return MultiDiscreteAction(space)
    if isinstance(space, spaces.Box):
        return TanhGaussianAction(space)
    raise ValueError(
        f"AMAGO supports Discrete, MultiDiscrete and Box action spaces, got {space}. "
        "Wrap the env to expose one of these (e.g. flatten a Tuple of Discretes into MultiDiscrete)."
    )
