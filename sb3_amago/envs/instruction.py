"""The base of the instruction-following envs: MazeRunner, Package Delivery, Crafter instructions.

Every such env follows the convention of :mod:`sb3_amago.goals` and gives AMAGO everything it
conditions on through a Dict observation:

* the task observation (one or more keys, set by the subclass);
* ``"instruction"``: ``MultiDiscrete([n_tokens] * max_goals)``, the goal tokens to reach in order,
  0-padded, constant over the rollout;
* ``"achieved"``: ``MultiDiscrete([n_tokens] * m)``, the goal tokens achieved on arriving at the
  step, 0-padded (all zeros at reset: nothing is achieved by being placed somewhere);
* ``"prev_reward"``: ``Box(0, success_reward, (1,), float32)``, the reward received on arriving at the
  step, 0 at reset.

Reward, termination and truncation are the same for all of them and live here only: arriving at
a step whose ``achieved`` holds the first goal not yet completed pays ``success_reward`` (at most one
goal per step, computed with :func:`sb3_amago.goals.goal_completion_steps`, so the live rewards are
exactly :func:`sb3_amago.goals.instruction_rewards` over the rollout's ``achieved`` history); the
episode terminates when the last goal is completed (or when the task itself fails, e.g. death in
Crafter) and is truncated after ``horizon`` steps. ``info["success"]`` (and ``info["is_success"]``,
the key SB3's ``EvalCallback`` logs) says whether the instruction is complete, and
``info["goals_completed"]`` how many of its goals are done.

``reset(options={"instruction": [t1, t2, ...]})`` sets the instruction instead of drawing one.
"""

import abc
from collections.abc import Sequence
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from sb3_amago.envs.checks import check_action, check_int
from sb3_amago.goals import goal_completion_steps, n_goals
from sb3_amago.keys import ACHIEVED_KEY, INSTRUCTION_KEY, PREV_REWARD_KEY


class InstructionEnv(gym.Env[dict[str, Any], np.int64], abc.ABC):
    """Instruction plumbing shared by the goal envs; subclasses implement the task.

    A subclass builds its world in :meth:`_reset_task` (using ``self.np_random``), draws goal tokens
    in :meth:`_sample_goals`, applies an action in :meth:`_act` (returning the tokens achieved on
    arriving at the new step) and renders its observation in :meth:`_task_obs`.

    :param task_spaces: the observation spaces of the task, by key
    :param n_actions: size of the ``Discrete`` action space
    :param n_tokens: goal vocabulary size, token 0 included (the empty goal)
    :param achieved_size: ``m``, the slots of ``"achieved"``
    :param min_goals: fewest goals an instruction drawn at reset has
    :param max_goals: most goals an instruction has (the width of ``"instruction"``)
    :param horizon: steps after which the episode is truncated
    :param success_reward: reward for completing each goal
    :param render_mode: one of ``metadata["render_modes"]`` or None
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        task_spaces: dict[str, spaces.Space],
        n_actions: int,
        n_tokens: int,
        achieved_size: int,
        min_goals: int,
        max_goals: int,
        horizon: int,
        success_reward: float = 1.0,
        render_mode: str | None = None,
    ) -> None:
        self.max_goals = check_int("max_goals", max_goals, 1, n_tokens - 1)
        self.min_goals = check_int("min_goals", min_goals, 1, self.max_goals)
        self.horizon = check_int("horizon", horizon, 1)
        if not np.isfinite(success_reward) or success_reward <= 0:
            raise ValueError(f"success_reward must be a finite number > 0, got {success_reward!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            # A TypeError, like an env that takes no render_mode at all: SB3's make_vec_env asks for
            # "rgb_array" and retries without it on TypeError.
            raise TypeError(
                f"{type(self).__name__} does not render in mode {render_mode!r}: render_mode must be one of "
                f"{self.metadata['render_modes']} or None"
            )
        reserved = {INSTRUCTION_KEY, ACHIEVED_KEY, PREV_REWARD_KEY} & set(task_spaces)
        if reserved:
            raise ValueError(f"Task observation keys {sorted(reserved)} clash with the instruction keys")
        self.n_tokens = n_tokens
        self.success_reward = float(success_reward)
        self.render_mode = render_mode
        self.action_space = spaces.Discrete(n_actions)
        #: Width ``m`` of the achieved-goal key.
        self.achieved_size = achieved_size
        self.observation_space = spaces.Dict(
            {
                **task_spaces,
                INSTRUCTION_KEY: spaces.MultiDiscrete([n_tokens] * self.max_goals),
                ACHIEVED_KEY: spaces.MultiDiscrete([n_tokens] * achieved_size),
                PREV_REWARD_KEY: spaces.Box(0.0, self.success_reward, shape=(1,), dtype=np.float32),
            }
        )
        self._instruction: np.ndarray | None = None
        self._n_goals = 0
        self._progress = 0
        self._t = 0

    @property
    def instruction(self) -> np.ndarray:
        """The current instruction, ``(max_goals,)`` int64, 0-padded."""
        if self._instruction is None:
            raise RuntimeError("Call reset() first.")
        return self._instruction.copy()

    @property
    def current_goal(self) -> int:
        """The token of the first goal not yet completed, 0 once the instruction is complete."""
        if self._progress >= self._n_goals:
            return 0
        return int(self.instruction[self._progress])

    @abc.abstractmethod
    def _reset_task(self) -> None:
        """Build a new world for an episode, drawing from ``self.np_random``."""

    @abc.abstractmethod
    def _sample_goals(self, n: int) -> Sequence[int]:
        """``n`` distinct goal tokens for the world just built."""

    @abc.abstractmethod
    def _act(self, action: int) -> tuple[Sequence[int], bool]:
        """Apply a valid action; return the goal tokens achieved on arriving at the new step, and
        whether the task failed (the episode terminates without success)."""

    @abc.abstractmethod
    def _task_obs(self) -> dict[str, np.ndarray]:
        """The task's part of the observation."""

    def _set_instruction(self, goals: Sequence[int]) -> None:
        goals = [int(g) for g in goals]
        if not 1 <= len(goals) <= self.max_goals:
            raise ValueError(f"An instruction needs 1 to {self.max_goals} goals, got {len(goals)}")
        if any(not 1 <= g < self.n_tokens for g in goals):
            raise ValueError(f"Goal tokens must be in [1, {self.n_tokens - 1}], got {goals}")
        instruction = np.zeros(self.max_goals, dtype=np.int64)
        instruction[: len(goals)] = goals
        self._instruction = instruction
        self._n_goals = n_goals(instruction)

    def _observation(self, achieved: np.ndarray, reward: float) -> dict[str, np.ndarray]:
        return {
            **self._task_obs(),
            INSTRUCTION_KEY: self.instruction,
            ACHIEVED_KEY: achieved,
            PREV_REWARD_KEY: np.array([reward], dtype=np.float32),
        }

    def _info(self) -> dict[str, Any]:
        success = self._progress >= self._n_goals
        return {"success": success, "is_success": success, "goals_completed": self._progress}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Start an episode in a new world, with ``options["instruction"]`` if given, else a random one."""
        super().reset(seed=seed)
        self._reset_task()
        if options is not None and options.get(INSTRUCTION_KEY) is not None:
            self._set_instruction(options[INSTRUCTION_KEY])
        else:
            n = int(self.np_random.integers(self.min_goals, self.max_goals + 1))
            self._set_instruction(self._sample_goals(n))
        self._progress = 0
        self._t = 0
        achieved = np.zeros(self.achieved_size, dtype=np.int64)
        return self._observation(achieved, 0.0), self._info()

    def step(self, action: np.int64 | int) -> tuple[dict[str, np.ndarray], SupportsFloat, bool, bool, dict[str, Any]]:
        """Apply ``action``; pay ``success_reward`` if the current goal is achieved on arrival."""
        if self._instruction is None:
            raise RuntimeError("Call reset() before step().")
        check_action(self.action_space, action)
        tokens, failed = self._act(int(action))
        achieved = np.zeros(self.achieved_size, dtype=np.int64)
        if len(tokens) > len(achieved):
            raise RuntimeError(f"{len(tokens)} goals achieved in one step, more than the {len(achieved)} slots")
        achieved[: len(tokens)] = tokens
        self._t += 1
        reward = 0.0
        # The remaining instruction against this single step: its first goal completes here or not.
        completed = goal_completion_steps(self._instruction[self._progress :], achieved[None])
        if len(completed) > 0 and completed[0] == 0:
            reward = self.success_reward
            self._progress += 1
        info = self._info()
        terminated = info["success"] or failed
        truncated = self._t >= self.horizon and not terminated
        return self._observation(achieved, reward), reward, terminated, truncated, info
