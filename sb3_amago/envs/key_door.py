"""Dark key-to-door (after Laskin et al. 2022, "In-context RL with algorithm distillation"; AMAGO
section 5.2): a meta-RL gridworld where the agent sees only its own position."""

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from sb3_amago.envs.checks import check_action, check_int
from sb3_amago.wrappers import TrialsWrapper

#: Row/column change of each action: stay, up, down, left, right.
MOVES = np.array([(0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)], dtype=np.int64)


class DarkKeyToDoorEnv(gym.Env):
    """One trial of dark key-to-door: find an invisible key, then an invisible door.

    A task is a (key cell, door cell) pair in a ``size x size`` room, drawn uniformly with key !=
    door. The agent starts each trial on a uniformly drawn cell that is neither key nor door. It is
    "dark": the agent observes only its own position, not the key, the door, nor whether it holds
    the key (that it can infer from the reward it received, which the trials wrapper puts in the
    observation). This follows the dark version of Laskin et al.

    - **Observation**: ``Box(0, size - 1, (2,), float32)``: the agent's (row, column).
    - **Actions**: ``Discrete(5)``: 0 stay, 1 up, 2 down, 3 left, 4 right; moves into a wall stay.
    - **Episode (trial)**: terminates on reaching the door holding the key; truncated after
      ``trial_length`` steps (50).
    - **Reward**: +1 on first stepping onto the key in a trial, +1 on stepping onto the door holding
      it; a trial's return is 0, 1 or 2.
    - **Tasks**: :class:`sb3_amago.wrappers.TaskEnv` protocol: ``sample_task(np_random)`` returns
      ``(key, door)`` as a ``(2, 2)`` int array of (row, column); ``set_task`` fixes it for every
      following reset. Without ``set_task`` each reset draws a new task (a plain, memoryless-task env).
    - **Solved**: 2 on every trial once key and door have been found, so in the registered 500-step
      rollout the return grows with the number of trials completed (shortest paths between start,
      key and door average about 12 steps in a 9 x 9 room).

    :param size: side of the square room (>= 2)
    :param trial_length: steps per trial before truncation (>= 1)
    """

    metadata = {"render_modes": []}

    def __init__(self, size: int = 9, trial_length: int = 50) -> None:
        self.size = check_int("size", size, 2)
        self.trial_length = check_int("trial_length", trial_length, 1)
        self.observation_space = spaces.Box(0.0, float(self.size - 1), shape=(2,), dtype=np.float32)
        self.action_space = spaces.Discrete(len(MOVES))
        self._fixed_task: np.ndarray | None = None
        self._key = np.zeros(2, dtype=np.int64)
        self._door = np.zeros(2, dtype=np.int64)
        self._pos = np.zeros(2, dtype=np.int64)
        self._has_key = False
        self._t = 0

    @property
    def has_key(self) -> bool:
        """Whether the agent holds the key in the current trial (hidden from the agent)."""
        return self._has_key

    def sample_task(self, np_random: np.random.Generator) -> np.ndarray:
        """Draw distinct key and door cells: ``[[key_row, key_col], [door_row, door_col]]``."""
        cells = np_random.choice(self.size * self.size, size=2, replace=False)
        return np.stack(np.divmod(cells, self.size), axis=1).astype(np.int64)

    def set_task(self, task: np.ndarray) -> None:
        """Use these key and door cells from the next reset on."""
        task = np.asarray(task, dtype=np.int64)
        if task.shape != (2, 2) or task.min() < 0 or task.max() >= self.size or np.array_equal(task[0], task[1]):
            raise ValueError(
                "A task is two distinct cells [[key_row, key_col], [door_row, door_col]] "
                f"in [0, {self.size - 1}], got {task.tolist()}."
            )
        self._fixed_task = task.copy()

    @property
    def key(self) -> np.ndarray:
        """The key cell of the current trial."""
        return self._key.copy()

    @property
    def door(self) -> np.ndarray:
        """The door cell of the current trial."""
        return self._door.copy()

    def _obs(self) -> np.ndarray:
        return self._pos.astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Start a trial on a random free cell (drawing a task first if none was set)."""
        super().reset(seed=seed)
        task = self._fixed_task if self._fixed_task is not None else self.sample_task(self.np_random)
        self._key, self._door = task[0].copy(), task[1].copy()
        taken = {self._key[0] * self.size + self._key[1], self._door[0] * self.size + self._door[1]}
        start = self.np_random.choice([c for c in range(self.size * self.size) if c not in taken])
        self._pos = np.array(divmod(int(start), self.size), dtype=np.int64)
        self._has_key = False
        self._t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Move one cell (walls stop the agent); collect the key, then open the door."""
        check_action(self.action_space, action)
        self._pos = np.clip(self._pos + MOVES[int(action)], 0, self.size - 1)
        self._t += 1
        reward, terminated = 0.0, False
        if not self._has_key and np.array_equal(self._pos, self._key):
            self._has_key, reward = True, 1.0
        elif self._has_key and np.array_equal(self._pos, self._door):
            reward, terminated = 1.0, True
        truncated = not terminated and self._t >= self.trial_length
        return self._obs(), reward, terminated, truncated, {"success": terminated}


def make_dark_key_to_door(size: int = 9, trial_length: int = 50, rollout_length: int = 500) -> gym.Env:
    """The registered ``amago-DarkKeyToDoor-v0``: one task for ``rollout_length`` steps of trials.

    The rollout holds as many trials as fit in ``rollout_length`` steps (10 if every trial runs its
    full 50 steps, more as the agent gets faster), so the return measures how quickly the agent finds
    and then reuses the key and door positions. Observations are Dict ``observation`` (position),
    ``prev_reward``, ``trial_reset`` (see :class:`TrialsWrapper`).
    """
    rollout_length = check_int("rollout_length", rollout_length, 1)
    return TrialsWrapper(DarkKeyToDoorEnv(size, trial_length), max_rollout_steps=rollout_length)
