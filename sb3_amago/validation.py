"""Checks of the data that comes from envs, each in one place: :func:`check_finite` (NaN and
infinite values, for the policy's inputs and the replay's), :func:`check_in_space` (values a
space cannot hold) and :class:`StepLayout`, the one validation of each step the replay stores,
whether it comes from an env one step at a time (:meth:`StepLayout.validate`) or from a dataset
one whole rollout at a time (:meth:`StepLayout.validate_rollout`).
"""

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from gymnasium import spaces

from sb3_amago.keys import OBS_KEY
from sb3_amago.relabel import Rollout

ENV_FIX = "fix the env, or wrap it with stable_baselines3.common.vec_env.VecCheckNan to find the step that produces them."


def check_finite(label: str, value: np.ndarray, fix: str = ENV_FIX) -> None:
    """Raise a ValueError naming ``label`` if the float array ``value`` holds NaN or infinite values."""
    if np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
        raise ValueError(f"{label} holds NaN or infinite values: {fix}")


def _check_discrete(label: str, value: np.ndarray, low: np.ndarray | int, high: np.ndarray | int) -> None:
    """Raise a ValueError unless ``value`` ``(n_envs, ...)`` holds integers in ``[low, high)`` (bounds per element)."""
    check_finite(label, value, fix="a discrete space holds integers only.")
    flat = value.reshape(len(value), -1)
    low, high = np.reshape(low, -1), np.reshape(high, -1)
    if np.issubdtype(flat.dtype, np.floating) and not np.array_equal(flat, np.round(flat)):
        raise ValueError(f"{label} holds non-integer values for a discrete space")
    if np.any(flat < low) or np.any(flat >= high):
        raise ValueError(f"{label} holds values outside the space's range [{low}, {high})")


def check_in_space(label: str, value: np.ndarray, space: spaces.Space, fix: str = ENV_FIX) -> None:
    """Raise a ValueError if ``value`` ``(n_envs, *shape)`` holds values the space cannot (or NaN / inf)."""
    if isinstance(space, spaces.Discrete):
        _check_discrete(label, value, int(space.start), int(space.start + space.n))
    elif isinstance(space, spaces.MultiDiscrete):
        _check_discrete(label, value, space.start, space.start + space.nvec)
    elif isinstance(space, spaces.MultiBinary):
        _check_discrete(label, value, 0, 2)
    else:
        check_finite(label, value, fix)


class Step(NamedTuple):
    """One validated step of every env: observations key by key ``(n_envs, *shape)``, actions
    ``(n_envs, action_dim)``, and ``(n_envs,)`` rewards (float32), ends and time-limit ends (bool)."""

    obs: dict[str, np.ndarray]
    next_obs: dict[str, np.ndarray]
    action: np.ndarray
    reward: np.ndarray
    done: np.ndarray
    timeout: np.ndarray


@dataclass(frozen=True)
class StepLayout:
    """The shapes and spaces of one step of ``n_envs`` envs, and its validation (:meth:`validate`).

    :param observation_space: a flat observation space (a Dict of non-Dict spaces, or one space)
    :param obs_spaces: its parts by key (:data:`~sb3_amago.keys.OBS_KEY` for a non-Dict space)
    :param obs_shapes: the stored shape of each part (SB3's ``get_obs_shape``)
    :param action_space: the action space
    :param action_dim: width of one action in the buffer representation
    :param n_envs: number of envs
    :param handle_timeout_termination: whether a time-limit end (``infos[i]["TimeLimit.truncated"]``)
        counts as one (else every end is a termination)
    """

    observation_space: spaces.Space
    obs_spaces: dict[str, spaces.Space]
    obs_shapes: dict[str, tuple[int, ...]]
    action_space: spaces.Space
    action_dim: int
    n_envs: int
    handle_timeout_termination: bool = True

    def validate(
        self,
        obs: np.ndarray | dict[str, np.ndarray],
        next_obs: np.ndarray | dict[str, np.ndarray],
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> Step:
        """The step as arrays of the layout's shapes, or a ValueError naming what is wrong (SB3's
        ``ReplayBuffer.add`` arguments)."""
        n = self.n_envs
        obs_, next_obs_ = self.observations("obs", obs), self.observations("next_obs", next_obs)
        action = np.asarray(action)
        if action.size != n * self.action_dim:
            raise ValueError(f"action has shape {action.shape}, expected ({n}, {self.action_dim})")
        action = action.reshape(n, self.action_dim)
        check_in_space("action", action, self.action_space, fix="the replay stores finite actions only.")
        reward = np.asarray(reward, dtype=np.float32)
        if reward.size != n:
            raise ValueError(f"reward has shape {reward.shape}, expected ({n},)")
        check_finite("reward", reward)
        done = np.asarray(done)
        if done.size != n:
            raise ValueError(f"done has shape {done.shape}, expected ({n},)")
        if len(infos) != n:
            raise ValueError(f"infos has {len(infos)} entries, expected {n}")
        done = done.reshape(n).astype(bool)
        timeout = np.zeros(n, dtype=bool)
        if self.handle_timeout_termination:
            timeout = done & np.array([bool(info.get("TimeLimit.truncated", False)) for info in infos])
        return Step(obs_, next_obs_, action, reward.reshape(n), done, timeout)

    def validate_rollout(self, rollout: Rollout) -> Rollout:
        """A whole finished rollout of ``T`` transitions (observations ``(T + 1, ...)`` key by key,
        actions ``(T, action_dim)``, rewards ``(T,)``) as arrays of the layout's shapes, checked as
        :meth:`validate` checks each step, or a ValueError naming what is wrong. It must end
        terminated or truncated (one of the two); with ``handle_timeout_termination=False`` a
        truncated end is stored as a termination, as a step's is."""
        n = rollout.length
        if n < 1:
            raise ValueError("the rollout holds no transition (an episode needs at least one step)")
        fix = "the replay stores finite values within the spaces only: fix or leave out this episode."
        rewards = np.asarray(rollout.rewards)
        if rewards.shape != (n,):
            raise ValueError(f"rewards have shape {rewards.shape}, expected ({n},)")
        check_finite("rewards", rewards, fix=fix)
        actions = np.asarray(rollout.actions)
        if actions.shape[:1] != (n,) or actions.size != n * self.action_dim:
            raise ValueError(f"actions have shape {actions.shape}, expected ({n}, {self.action_dim}) for {n} rewards")
        actions = actions.reshape(n, self.action_dim)
        check_in_space("actions", actions, self.action_space, fix=fix)
        given: np.ndarray | dict[str, np.ndarray] = rollout.observations
        if not isinstance(self.observation_space, spaces.Dict) and list(rollout.observations) == [OBS_KEY]:
            given = rollout.observations[OBS_KEY]  # a rollout holds its observations by key, OBS_KEY for a non-Dict space
        observations = self.observations("observations", given, rows=n + 1, fix=fix)
        if rollout.terminated == rollout.truncated:
            state = "both terminated and truncated" if rollout.terminated else "neither terminated nor truncated"
            raise ValueError(f"the rollout ends {state}: a stored rollout ends in exactly one of the two")
        truncated = bool(rollout.truncated) and self.handle_timeout_termination
        return Rollout(observations, actions, rewards.astype(np.float32), terminated=not truncated, truncated=truncated)

    def observations(
        self, name: str, obs: np.ndarray | dict[str, np.ndarray], rows: int | None = None, fix: str = ENV_FIX
    ) -> dict[str, np.ndarray]:
        """``obs`` key by key as ``(rows, *shape)`` arrays (``rows``: ``n_envs`` unless given), or a
        ValueError naming what is wrong (and ``fix``, for values outside the space)."""
        if isinstance(self.observation_space, spaces.Dict):
            if not isinstance(obs, dict):
                raise ValueError(f"{name} must be a dict for a Dict observation space, got {type(obs).__name__}")
            missing = [key for key in self.obs_spaces if key not in obs]
            if missing:
                raise ValueError(f"{name} lacks the keys {missing}")
            items = {key: obs[key] for key in self.obs_spaces}
        else:
            items = {OBS_KEY: np.asarray(obs)}
        validated = {}
        for key, value in items.items():
            label = name if key == OBS_KEY and len(items) == 1 else f"{name}['{key}']"
            value = np.asarray(value)
            n = self.n_envs if rows is None else rows
            shape = (n, *self.obs_shapes[key])
            if isinstance(self.obs_spaces[key], spaces.Discrete) and value.size == n:
                value = value.reshape(shape)
            if value.shape != shape:
                raise ValueError(f"{label} has shape {value.shape}, expected {shape}")
            check_in_space(label, value, self.obs_spaces[key], fix)
            validated[key] = value
        return validated
