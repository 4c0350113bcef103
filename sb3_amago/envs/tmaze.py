"""Passive T-maze (Ni et al. 2023, "When do transformers shine in RL? Decoupling memory from credit
assignment"), the memory test AMAGO solved up to a corridor of 10,000 steps."""

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from sb3_amago.envs.checks import check_action, check_int
from sb3_amago.wrappers import PrevRewardWrapper

MAX_CORRIDOR_LENGTH = 10_000


class TMazeEnv(gym.Env):
    """Passive T-maze: a goal side shown once, an ``H``-step corridor, then a choice.

    The agent starts at the left end of a corridor of ``H`` cells; the junction is ``H`` cells to
    the right. Only the first observation shows whether the goal is up or down. An agent that moves
    right on each of the first ``H`` steps stands at the junction on step ``H + 1``, where it must
    turn towards the goal, so the cue must be remembered for ``H`` steps.

    - **Observation**: ``Box(0, 1, (3,), float32)``: ``[goal is up, goal is down, at junction]``.
      The two cue entries are non-zero only in the first observation.
    - **Actions**: ``Discrete(4)``: 0 right (forward), 1 up, 2 down, 3 left. Up and down do not move
      in the corridor; left at the start and right at the junction do not move either.
    - **Episode**: exactly ``H + 1`` steps; the episode terminates after step ``H + 1`` (the choice).
    - **Reward**: on each of the first ``H`` steps, ``-1 / H`` if the action is not "right" (Ni et
      al.'s penalty ``-1 / (T - 1)`` with ``T = H + 1``, which keeps the agent moving so that the
      memory length is exactly ``H``); on the last step, ``+1`` if the agent is at the junction and
      turns to the goal side, else 0. Returns lie in ``[-1, 1]``.
    - **Info**: on the last step ``"success"`` and ``"is_success"`` (SB3's key): the correct turn.
    - **Solved**: return 1 (success on every episode); a memory-free policy scores 0.5 on average.

    :param corridor_length: ``H``, the number of corridor steps between cue and junction, 1 to 10,000
    """

    metadata = {"render_modes": []}
    RIGHT, UP, DOWN, LEFT = range(4)

    def __init__(self, corridor_length: int = 50) -> None:
        self.corridor_length = check_int("corridor_length", corridor_length, 1, MAX_CORRIDOR_LENGTH)
        self.observation_space = spaces.Box(0.0, 1.0, shape=(3,), dtype=np.float32)
        self.action_space = spaces.Discrete(4)
        self._goal_up = True
        self._position = 0
        self._t = 0

    def _obs(self, show_cue: bool) -> np.ndarray:
        cue_up = float(show_cue and self._goal_up)
        cue_down = float(show_cue and not self._goal_up)
        return np.array([cue_up, cue_down, float(self._position == self.corridor_length)], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Start a new episode with a goal side drawn uniformly."""
        super().reset(seed=seed)
        self._goal_up = bool(self.np_random.integers(2))
        self._position = 0
        self._t = 0
        return self._obs(show_cue=True), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Move in the corridor (first ``H`` steps) or make the choice (step ``H + 1``)."""
        check_action(self.action_space, action)
        action = int(action)
        info: dict[str, Any] = {}
        if self._t < self.corridor_length:
            if action == self.RIGHT:
                self._position = min(self._position + 1, self.corridor_length)
                reward = 0.0
            else:
                if action == self.LEFT:
                    self._position = max(self._position - 1, 0)
                reward = -1.0 / self.corridor_length
            terminated = False
        else:
            correct = self.UP if self._goal_up else self.DOWN
            success = self._position == self.corridor_length and action == correct
            reward = 1.0 if success else 0.0
            info["success"] = info["is_success"] = success
            terminated = True
        self._t += 1
        return self._obs(show_cue=False), reward, terminated, False, info

    @property
    def goal_up(self) -> bool:
        """The goal side of the current episode (for scripted policies and tests)."""
        return self._goal_up


def make_tmaze(corridor_length: int = 50) -> gym.Env:
    """A :class:`TMazeEnv` with the previous reward in the observation (the registered ids)."""
    return PrevRewardWrapper(TMazeEnv(corridor_length))
