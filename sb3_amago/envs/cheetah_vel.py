"""HalfCheetah with a hidden target velocity (Finn et al. 2017's meta-RL task; targets as in
Rakelly et al. 2019, "PEARL"), on gymnasium's MuJoCo HalfCheetah v5."""

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import TimeLimit

from sb3_amago.envs.checks import check_action, check_int
from sb3_amago.wrappers import TrialsWrapper

try:
    from gymnasium.envs.mujoco.half_cheetah_v5 import HalfCheetahEnv
except (ImportError, gym.error.DependencyNotInstalled) as err:
    raise ImportError("HalfCheetahVel needs MuJoCo: install the envs extra: pip install 'sb3-amago[envs]'") from err


class HalfCheetahVelEnv(HalfCheetahEnv):
    """HalfCheetah (v5) rewarded for running at a target forward velocity it does not observe.

    - **Observation**: HalfCheetah v5's ``Box(-inf, inf, (17,), float64)`` (joint positions without
      the x coordinate, and velocities); the target is not in it.
    - **Actions**: ``Box(-1, 1, (6,), float32)`` joint torques.
    - **Reward**: ``-|v_x - v_target| - ctrl_cost_weight * sum(a^2)`` with ``ctrl_cost_weight``
      0.05 (the cheetah-vel convention ``0.5 * 0.1 * |a|^2``); ``info["x_velocity"]``,
      ``info["target_velocity"]``, ``info["reward_velocity"]`` and ``info["reward_ctrl"]`` give the parts.
    - **Episode**: never terminates; the registered id cuts trials at 200 steps (truncation).
    - **Tasks**: ``sample_task(np_random)`` draws ``v_target ~ U[0, max_velocity]`` (3.0);
      ``set_task`` fixes it for every following reset. Without ``set_task`` each reset draws a target.
    - **Solved**: close to 0 per step once the speed is identified (the control cost of running keeps
      it a little below 0); a standing cheetah scores ``-v_target`` per step, -1.5 on average.

    :param max_velocity: upper end of the target distribution (> 0)
    :param ctrl_cost_weight: weight of the squared-action cost
    :param kwargs: passed to gymnasium's ``HalfCheetahEnv`` (e.g. ``reset_noise_scale``)
    """

    def __init__(self, max_velocity: float = 3.0, ctrl_cost_weight: float = 0.05, **kwargs: Any) -> None:
        if not max_velocity > 0:
            raise ValueError(f"max_velocity must be > 0, got {max_velocity!r}.")
        super().__init__(ctrl_cost_weight=ctrl_cost_weight, **kwargs)
        self.max_velocity = float(max_velocity)
        self._fixed_target: float | None = None
        self.target_velocity = 0.0

    def sample_task(self, np_random: np.random.Generator) -> float:
        """Draw a target velocity from ``U[0, max_velocity]``."""
        return float(np_random.uniform(0.0, self.max_velocity))

    def set_task(self, task: float) -> None:
        """Use this target velocity from the next reset on."""
        self._fixed_target = float(task)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Reset the cheetah (drawing a target first if none was set)."""
        obs, info = super().reset(seed=seed, options=options)
        fixed = self._fixed_target
        self.target_velocity = fixed if fixed is not None else self.sample_task(self.np_random)
        return obs, info

    # MujocoEnv annotates step with float64 rewards and float64 info values; this returns the Env API's types.
    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:  # type: ignore[override]
        """Step the simulation and score the velocity error."""
        check_action(self.action_space, action)
        obs, _, terminated, truncated, info = super().step(action)
        velocity_reward = -abs(info["x_velocity"] - self.target_velocity)
        info = {**info, "target_velocity": self.target_velocity, "reward_velocity": velocity_reward}
        return obs, velocity_reward + info["reward_ctrl"], terminated, truncated, info


def make_half_cheetah_vel(n_trials: int = 2, trial_length: int = 200, **kwargs: Any) -> gym.Env:
    """The registered ``amago-HalfCheetahVel-v0``: ``n_trials`` trials of ``trial_length`` steps per target.

    Observations are Dict ``observation``, ``prev_reward``, ``trial_reset`` (see :class:`TrialsWrapper`).

    :param kwargs: passed to :class:`HalfCheetahVelEnv`
    """
    trial_length = check_int("trial_length", trial_length, 1)
    return TrialsWrapper(TimeLimit(HalfCheetahVelEnv(**kwargs), trial_length), n_trials=n_trials)
