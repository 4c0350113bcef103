"""Exploration during collection: how the actions AMAGO takes depart from its policy's.

One :class:`Exploration` object per model, with its own state (saved and resumed with the run).
``AMAGO.learn`` calls it as follows:

* :meth:`~Exploration.check` once, when the model is built, with the env's action space;
* :meth:`~Exploration.reset` when collection starts new rollouts in every env (the first
  ``learn``, or one that resets the envs);
* :meth:`~Exploration.explore` on the policy's sampled actions at every step from
  ``learning_starts`` on (before it, actions are uniformly random and nothing is called);
* :meth:`~Exploration.end_rollouts` after each step at which some envs finished their episode;
* :meth:`~Exploration.epsilon` when logging (``rollout/exploration_epsilon``, if not None);
* :meth:`~Exploration.get_state` / :meth:`~Exploration.set_state` when the model is saved and
  loaded (the state must be what continuing the run exactly needs, as CPU copies).

Implementations: :class:`EpsilonSchedule` (the default), :class:`BiLevelSchedule` (the default with
``rollout_exploration_horizon``), :class:`QuietSpanSchedule` (little exploration over a span of each
rollout, e.g. the T-maze's corridor) and :class:`ActionNoiseExploration` (SB3's ``ActionNoise``, for Box
actions). Any randomness should come from the global RNGs (numpy's, torch's), whose states the
saved run carries.
"""

import abc
import copy
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.noise import ActionNoise, VectorizedActionNoise

from sb3_amago.distributions import ActionType


class Exploration(abc.ABC):
    """The interface AMAGO's collection uses (see the module docstring for when each method runs)."""

    def check(self, action_space: spaces.Space) -> None:
        """Raise a ValueError naming the fix if this exploration cannot act in ``action_space``."""

    def reset(self, n_envs: int) -> None:
        """Start over for ``n_envs`` envs, all beginning new rollouts."""

    def end_rollouts(self, done: np.ndarray) -> None:
        """The envs where ``done`` ``(N,)`` is True begin new rollouts with their next step."""

    @abc.abstractmethod
    def explore(self, action: th.Tensor, time_idx: th.Tensor, num_timesteps: int, action_type: ActionType) -> th.Tensor:
        """The actions to take instead of the policy's.

        :param action: the policy's sampled actions, buffer representation ``(N, action_dim)``
            (Box actions scaled to [-1, 1])
        :param time_idx: ``(N,)`` time index of the current step in each env's rollout
        :param num_timesteps: env steps collected so far (SB3's ``num_timesteps``)
        :param action_type: the action space's :class:`~sb3_amago.distributions.ActionType`
            (its ``explore`` applies epsilon-greedy or Gaussian noise of a given level per env)
        :return: actions in the same representation, shape and dtype
        """

    def epsilon(self, num_timesteps: int) -> float | None:
        """The exploration level to log at ``num_timesteps``, or None for nothing to log."""
        return None

    def get_state(self) -> dict[str, Any]:
        """What continuing the run needs (CPU copies, picklable); empty for a stateless exploration."""
        return {}

    def set_state(self, state: dict[str, Any]) -> None:
        """Put back what :meth:`get_state` returned."""


class EpsilonSchedule(Exploration):
    """AMAGO's default: a global level annealed linearly from ``start`` to ``end`` over ``steps`` env
    steps, times a per-env multiplier drawn from U(0, 1) when the env begins a rollout. The level
    ``eps`` of an env is applied by the action type: epsilon-greedy for Discrete (each sub-action on
    its own draw for MultiDiscrete), Gaussian noise of std ``eps`` for Box (in [-1, 1] units).

    :param start: level at env step 0
    :param end: level from ``steps`` env steps on
    :param steps: env steps over which the level goes from ``start`` to ``end``
    """

    def __init__(self, start: float = 1.0, end: float = 0.05, steps: int = 1_000_000) -> None:
        self.start = start
        self.end = end
        self.steps = steps
        #: ``(N,)`` the per-env multipliers, None before :meth:`reset`.
        self.scale: np.ndarray | None = None

    def __repr__(self) -> str:
        settings = ", ".join(f"{key}={value!r}" for key, value in vars(self).items() if key != "scale")
        return f"{type(self).__name__}({settings})"

    def reset(self, n_envs: int) -> None:
        self.scale = np.random.uniform(0.0, 1.0, size=n_envs)

    def end_rollouts(self, done: np.ndarray) -> None:
        if np.any(done):
            assert self.scale is not None
            self.scale[done] = np.random.uniform(0.0, 1.0, size=int(np.sum(done)))

    def epsilon(self, num_timesteps: int) -> float:
        """The global level at ``num_timesteps``."""
        progress = min(1.0, num_timesteps / max(1, self.steps))
        return self.start + progress * (self.end - self.start)

    def env_levels(self, action: th.Tensor, time_idx: th.Tensor, num_timesteps: int) -> th.Tensor:
        """``(N,)`` each env's level, in the dtype and on the device of ``action``."""
        assert self.scale is not None, "reset() before explore()"
        return self.epsilon(num_timesteps) * th.as_tensor(self.scale, dtype=action.dtype, device=action.device)

    def explore(self, action: th.Tensor, time_idx: th.Tensor, num_timesteps: int, action_type: ActionType) -> th.Tensor:
        return action_type.explore(action, self.env_levels(action, time_idx, num_timesteps).unsqueeze(-1))

    def get_state(self) -> dict[str, Any]:
        return {"scale": None if self.scale is None else self.scale.copy()}

    def set_state(self, state: dict[str, Any]) -> None:
        self.scale = None if state["scale"] is None else state["scale"].copy()


class BiLevelSchedule(EpsilonSchedule):
    """The "bi-level" schedule: :class:`EpsilonSchedule`'s level also decays within each rollout,
    linearly to 5% of it at time index ``horizon`` (and stays there).

    :param horizon: time index at which the level reaches 5% of the global one
    """

    def __init__(self, start: float = 1.0, end: float = 0.05, steps: int = 1_000_000, horizon: int = 1) -> None:
        super().__init__(start, end, steps)
        self.horizon = horizon

    def env_levels(self, action: th.Tensor, time_idx: th.Tensor, num_timesteps: int) -> th.Tensor:
        t = time_idx.to(action.dtype) / self.horizon
        return super().env_levels(action, time_idx, num_timesteps) * (1.0 - 0.95 * t.clamp(max=1.0))


class QuietSpanSchedule(EpsilonSchedule):
    """:class:`EpsilonSchedule`'s level outside a span of each rollout's time indices, a small fixed
    level inside it.

    For rollouts with a stretch where one random action spoils what comes after it, followed (or
    preceded) by the choices worth exploring. The passive T-maze is the case: its corridor needs
    ``H`` "right" steps in a row before the choice at the junction. Noise at level ``eps`` along the
    corridor lets only a share of about ``exp(-0.75 eps H)`` of the rollouts reach the junction, and
    noise that decays along the rollout (:class:`BiLevelSchedule`) leaves almost none for the choice:
    both starve the one decision the task tests (memory, not exploration). Quiet in the corridor
    (``quiet_start=0, quiet_end=H``, a level of about ``0.5 / H``), every rollout that reaches the
    junction explores its choice at the annealed level. The original AMAGO trains its T-maze with a
    schedule of this kind.

    :param quiet_start: first time index of the span
    :param quiet_end: time index just after the span (``quiet_start < quiet_end``)
    :param quiet_level: the level at time indices in the span (neither annealed nor scaled per env)
    """

    def __init__(
        self,
        start: float = 1.0,
        end: float = 0.05,
        steps: int = 1_000_000,
        quiet_start: int = 0,
        quiet_end: int = 1,
        quiet_level: float = 0.0,
    ) -> None:
        if not 0 <= quiet_start < quiet_end:
            raise ValueError(
                f"QuietSpanSchedule needs 0 <= quiet_start < quiet_end (the span of time indices with little "
                f"exploration), got quiet_start={quiet_start}, quiet_end={quiet_end}."
            )
        if not 0.0 <= quiet_level <= 1.0:
            raise ValueError(f"QuietSpanSchedule's quiet_level must lie in [0, 1], got {quiet_level}.")
        super().__init__(start, end, steps)
        self.quiet_start = quiet_start
        self.quiet_end = quiet_end
        self.quiet_level = quiet_level

    def env_levels(self, action: th.Tensor, time_idx: th.Tensor, num_timesteps: int) -> th.Tensor:
        levels = super().env_levels(action, time_idx, num_timesteps)
        t = time_idx.to(levels.device)
        quiet = (t >= self.quiet_start) & (t < self.quiet_end)
        return levels.masked_fill(quiet, self.quiet_level)


def epsilon_schedule(start: float, end: float, steps: int, horizon: int | None) -> EpsilonSchedule:
    """AMAGO's schedule for its arguments ``epsilon_start``, ``epsilon_end``, ``exploration_steps`` and
    ``rollout_exploration_horizon`` (bi-level if the horizon is set)."""
    if horizon:
        return BiLevelSchedule(start, end, steps, horizon)
    return EpsilonSchedule(start, end, steps)


class ActionNoiseExploration(Exploration):
    """SB3's ``ActionNoise`` (``NormalActionNoise``, ``OrnsteinUhlenbeckActionNoise``, ...) applied as TD3
    applies it, for Box actions: the noise is added to the policy's action in [-1, 1] units and the
    sum clipped to [-1, 1]. With several envs a noise that is not a ``VectorizedActionNoise`` is
    wrapped in one (one process per env), as SB3 does; the noise of an env is reset when it begins a
    rollout.

    :param noise: the noise, of the action's shape (or ``(n_envs, *shape)`` for a vectorized one)
    """

    def __init__(self, noise: ActionNoise) -> None:
        if not isinstance(noise, ActionNoise):
            raise ValueError(f"action_noise must be an SB3 ActionNoise, got {type(noise).__name__}")
        self.base_noise = noise
        #: The noise in use (vectorized for several envs), None before :meth:`reset`.
        self.noise: ActionNoise | None = None

    def check(self, action_space: spaces.Space) -> None:
        if not isinstance(action_space, spaces.Box):
            raise ValueError(
                f"action_noise perturbs continuous actions, but the action space is {action_space}: drop action_noise "
                "and let the epsilon schedule (epsilon_start, epsilon_end, exploration_steps) explore, which is "
                "epsilon-greedy for Discrete and MultiDiscrete actions, or pass your own exploration=..."
            )

    def reset(self, n_envs: int) -> None:
        noise = self.base_noise
        if n_envs > 1 and not isinstance(noise, VectorizedActionNoise):
            noise = VectorizedActionNoise(noise, n_envs)
        if isinstance(noise, VectorizedActionNoise) and noise.n_envs != n_envs:
            raise ValueError(f"action_noise is a VectorizedActionNoise for {noise.n_envs} envs, but the model has {n_envs}")
        noise.reset()
        self.noise = noise

    def end_rollouts(self, done: np.ndarray) -> None:
        assert self.noise is not None
        for index in np.flatnonzero(done):
            if isinstance(self.noise, VectorizedActionNoise):
                self.noise.reset(indices=[int(index)])
            else:
                self.noise.reset()

    def explore(self, action: th.Tensor, time_idx: th.Tensor, num_timesteps: int, action_type: ActionType) -> th.Tensor:
        assert self.noise is not None, "reset() before explore()"
        noise = th.as_tensor(self.noise(), dtype=action.dtype, device=action.device).reshape(-1, action.shape[-1])
        return (action + noise).clamp(-1.0, 1.0)

    def get_state(self) -> dict[str, Any]:
        return {"noise": copy.deepcopy(self.noise)}

    def set_state(self, state: dict[str, Any]) -> None:
        self.noise = copy.deepcopy(state["noise"])
