"""Context wrappers: put what AMAGO's policy conditions on into the observation.

AMAGO's timestep encoder sees, besides the observation, the reward received on arriving at the
step (and, in meta-RL, a flag marking the start of a new trial). These come through the
observation so that training, ``predict``, ``evaluate_policy`` and RL Zoo's enjoy all see the same
inputs. The previous action is tracked by the model itself and needs no wrapper.

``PrevRewardWrapper(env)`` turns any env's observation into a Dict::

    Box / Discrete / ... obs  ->  {"observation": obs, "prev_reward": (1,) float32}
    Dict obs                  ->  the same dict plus "prev_reward"
    Tuple obs                 ->  {"observation_0": ..., "observation_1": ..., "prev_reward": ...}
"""

from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

OBS_KEY = "observation"
PREV_REWARD_KEY = "prev_reward"
TRIAL_RESET_KEY = "trial_reset"


def tuple_to_dict_space(space: spaces.Tuple, prefix: str = OBS_KEY) -> spaces.Dict:
    """``Tuple(a, b)`` -> ``Dict(prefix_0=a, prefix_1=b)`` (SB3 stores Dict, not Tuple, spaces)."""
    for sub in space.spaces:
        if isinstance(sub, (spaces.Tuple, spaces.Dict)):
            raise ValueError(f"Nested observation spaces are not supported: {space}. Flatten the inner space first.")
    return spaces.Dict({f"{prefix}_{i}": sub for i, sub in enumerate(space.spaces)})


def tuple_to_dict_obs(obs: tuple | list, prefix: str = OBS_KEY) -> dict[str, Any]:
    """The observation counterpart of :func:`tuple_to_dict_space`."""
    return {f"{prefix}_{i}": part for i, part in enumerate(obs)}


def _as_dict_space(space: spaces.Space) -> spaces.Dict:
    if isinstance(space, spaces.Dict):
        return spaces.Dict(dict(space.spaces))
    if isinstance(space, spaces.Tuple):
        return tuple_to_dict_space(space)
    return spaces.Dict({OBS_KEY: space})


def _as_dict_obs(space: spaces.Space, obs: Any) -> dict[str, Any]:
    if isinstance(space, spaces.Dict):
        return dict(obs)
    if isinstance(space, spaces.Tuple):
        return tuple_to_dict_obs(obs)
    return {OBS_KEY: obs}


class PrevRewardWrapper(gym.Wrapper):
    """Add the reward received on arriving at each step to the observation, key ``"prev_reward"``.

    The first observation of an episode carries reward 0.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        if isinstance(env.observation_space, spaces.Dict) and PREV_REWARD_KEY in env.observation_space.spaces:
            raise ValueError(f"The observation already has a '{PREV_REWARD_KEY}' key: wrap the env only once.")
        inner = env.observation_space
        self._inner_space = inner
        dict_space = _as_dict_space(inner)
        dict_space.spaces[PREV_REWARD_KEY] = spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float32)
        self.observation_space = dict_space

    def _wrap(self, obs: Any, reward: float) -> dict[str, Any]:
        out = _as_dict_obs(self._inner_space, obs)
        out[PREV_REWARD_KEY] = np.array([reward], dtype=np.float32)
        return out

    def reset(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return self._wrap(obs, 0.0), info

    def step(self, action: Any) -> tuple[dict[str, Any], SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._wrap(obs, float(reward)), reward, terminated, truncated, info
