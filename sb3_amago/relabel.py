"""Hindsight relabeling of sampled rollouts.

:class:`~sb3_amago.buffers.TrajectoryReplayBuffer` hands every rollout it samples to its relabeler
before cutting the window, so each sample is relabeled afresh and the stored data never changes.

* :class:`HindsightInstructionRelabeler`: AMAGO's multi-step instruction relabeling for the
  instruction envs of :mod:`sb3_amago.goals`.
* :class:`GoalEnvRelabeler`: the one-goal case for SB3-style goal envs (``observation`` /
  ``achieved_goal`` / ``desired_goal`` and ``compute_reward``), so HER users can switch.

Both share the strategy (how many extra goals, at which steps) and the rewrite of rewards, reward
input and end of the rollout in :class:`HindsightRelabeler`.
"""

import abc
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np
from gymnasium import spaces

from sb3_amago.goals import EMPTY_GOAL, goal_completion_steps, instruction_rewards, n_goals
from sb3_amago.keys import ACHIEVED_KEY, INSTRUCTION_KEY, PREV_REWARD_KEY

STRATEGIES = ("some", "all", "none")


@dataclass
class Rollout:
    """One rollout of ``T`` transitions: a fresh copy read from the replay buffer, or a dataset's
    episode on its way in (:meth:`~sb3_amago.buffers.TrajectoryReplayBuffer.add_rollouts`).

    :param observations: ``{key: (T + 1, *shape)}``, observation ``t`` by key. Only the keys the
        relabeler reads (its ``keys``) are present; the buffer gathers the others for the sampled
        window alone.
    :param actions: ``(T, action_dim)``, ``actions[t]`` is the action taken at observation ``t``
    :param rewards: ``(T,)`` float32, ``rewards[t]`` is the reward received on arriving at
        observation ``t + 1``
    :param terminated: observation ``T`` is a true terminal state (no bootstrapping from it)
    :param truncated: a time limit cut the rollout at observation ``T``. With neither flag the
        rollout is still running; like a truncated one, it bootstraps from observation ``T``.
    :param start_time: global time index of observation 0: 0, unless the rollout outgrew the
        buffer and lost its beginning
    """

    observations: dict[str, np.ndarray]
    actions: np.ndarray
    rewards: np.ndarray
    terminated: bool = False
    truncated: bool = False
    start_time: int = 0

    @property
    def length(self) -> int:
        """``T``, the number of transitions."""
        return len(self.rewards)

    def cut(self, end: int, terminated: bool) -> "Rollout":
        """The first ``end`` transitions (observations ``0 .. end``), ending terminated or truncated."""
        if not 0 < end <= self.length:
            raise ValueError(f"Cannot cut a rollout of {self.length} transitions at {end}")
        return replace(
            self,
            observations={key: value[: end + 1] for key, value in self.observations.items()},
            actions=self.actions[:end],
            rewards=self.rewards[:end],
            terminated=terminated,
            truncated=not terminated,
        )


@runtime_checkable
class Relabeler(Protocol):
    """What :class:`~sb3_amago.buffers.TrajectoryReplayBuffer` needs from a relabeler.

    ``relabel`` may rewrite the values of the observation ``keys`` and the rewards, and may cut the
    end of the rollout; it never shifts steps (observation ``t`` of its result is observation ``t``
    of its input) and never changes the stored data (the rollout it gets is a copy).
    """

    #: observation keys ``relabel`` reads or rewrites (those the env has are put in the rollout)
    keys: tuple[str, ...]
    #: observation keys the policy never sees: the buffer drops them from sampled batches
    hidden_keys: tuple[str, ...]

    def check(self, observation_space: spaces.Space) -> None:
        """Raise a ValueError if the observation space lacks what the relabeler needs."""

    def relabel(self, rollout: Rollout) -> Rollout:
        """A relabeled version of ``rollout`` (or ``rollout`` itself when nothing changes)."""


def _require_dict_keys(observation_space: spaces.Space, keys: tuple[str, ...], owner: str) -> spaces.Dict:
    if not isinstance(observation_space, spaces.Dict):
        raise ValueError(f"{owner} needs a Dict observation space with keys {list(keys)}, got {observation_space}")
    missing = [key for key in keys if key not in observation_space.spaces]
    if missing:
        raise ValueError(
            f"{owner} needs observation keys {list(keys)}, but the env's observation space lacks {missing} "
            f"(it has {list(observation_space.spaces)})"
        )
    return observation_space


class HindsightRelabeler(abc.ABC):
    """The shared part of hindsight relabeling.

    A rollout has ``k`` goal slots of which its real successes complete ``n``. The strategy draws
    ``h`` extra goals: ``"some"``: ``h ~ U{0 .. k - n}``; ``"all"``: ``h = k - n``; ``"none"``:
    ``h = 0``; in each case at most the number of candidate steps. The extra goals are taken at
    ``h`` distinct candidate steps drawn uniformly. With ``h = 0`` the rollout is returned as it is.

    :param strategy: ``"some"``, ``"all"`` or ``"none"``
    :param reward_key: the observation key holding the reward received on arriving at each step
        (``(1,)``); rewritten with the new rewards when the env has it
    """

    keys: tuple[str, ...]
    hidden_keys: tuple[str, ...]

    def __init__(self, strategy: str, reward_key: str) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
        self.strategy = strategy
        self.reward_key = reward_key

    def __repr__(self) -> str:
        return f"{type(self).__name__}(strategy={self.strategy!r})"

    @abc.abstractmethod
    def check(self, observation_space: spaces.Space) -> None:
        """Raise a ValueError if the observation space lacks what the relabeler needs."""

    @abc.abstractmethod
    def relabel(self, rollout: Rollout) -> Rollout:
        """A relabeled version of ``rollout`` (or ``rollout`` itself when nothing changes)."""

    def _draw_steps(self, n_slots: int, n_real: int, candidates: np.ndarray) -> np.ndarray:
        """The transitions that complete the extra goals.

        :param n_slots: ``k``, goal slots
        :param n_real: ``n``, goals the rollout really completed
        :param candidates: ``(c,)`` distinct transition indices an extra goal may be taken at
        :return: ``(h,)`` distinct candidates in time order, from the global ``np.random``
        """
        room = n_slots - n_real
        if self.strategy == "none" or room <= 0 or len(candidates) == 0:
            return np.zeros(0, dtype=np.int64)
        wanted = room if self.strategy == "all" else np.random.randint(0, room + 1)
        h = min(wanted, len(candidates))
        return np.sort(np.random.choice(candidates, size=h, replace=False)).astype(np.int64)

    def _finish(
        self,
        rollout: Rollout,
        observations: dict[str, np.ndarray],
        rewards: np.ndarray,
        end: int,
        terminated: bool,
    ) -> Rollout:
        """Put the new rewards (and the reward input) in the rollout and cut it after transition ``end - 1``.

        :param observations: the rollout's observations with the goal keys rewritten, ``(T + 1, ...)``
        :param rewards: ``(>= end,)`` the rewards under the new goals
        :param end: the number of transitions kept (the last success is on arriving at observation ``end``)
        :param terminated: whether observation ``end`` is terminal (else the rollout ends truncated)
        """
        new_rewards = rollout.rewards.copy()
        new_rewards[:end] = rewards[:end]
        observations = dict(observations)
        if self.reward_key in observations:
            reward_input = observations[self.reward_key].copy()
            reward_input[1 : end + 1] = new_rewards[:end].reshape((end,) + (1,) * (reward_input.ndim - 1))
            observations[self.reward_key] = reward_input
        relabeled = replace(rollout, observations=observations, rewards=new_rewards)
        return relabeled.cut(end, terminated)


class HindsightInstructionRelabeler(HindsightRelabeler):
    """AMAGO's hindsight instruction relabeling for :mod:`sb3_amago.goals` envs.

    Per sampled rollout, with ``k`` instruction slots:

    1. Real successes: the ``n`` goals the rollout completed under the reward rule
       (:func:`~sb3_amago.goals.goal_completion_steps`), kept at their steps.
    2. Candidates: a step that is not a real success and achieved a goal *fresh*, that is not
       achieved since the last real success before it. The reward rule completes a goal at its
       first occurrence after the previous completion, so only fresh goals are completed exactly
       at the step they are taken at, whatever other candidates are drawn; a goal the agent reached
       earlier and stayed on is taken where it was first reached.
    3. ``h`` candidates drawn by the strategy; at each, one of its fresh goals at random.
    4. The new instruction: the real and the drawn goals in time order fill the first ``n + h``
       slots; slots ``n + h ..`` keep their original goals.
    5. Rewards and the reward input are recomputed with :func:`~sb3_amago.goals.instruction_rewards`;
       other reward terms the env may pay are not kept.
    6. The rollout is cut at its last success: terminated if the new instruction is then complete,
       else truncated (it bootstraps).

    With ``h = 0`` the rollout is returned unchanged. The achieved key is hidden from the policy.

    :param strategy: ``"some"``, ``"all"`` or ``"none"``
    :param instruction_key: observation key of the instruction, ``(k,)`` goal tokens
    :param achieved_key: observation key of the goals achieved on arriving at each step, ``(m,)``
    :param reward_key: observation key of the reward input
    :param success_reward: reward the env pays for each completed goal
    """

    def __init__(
        self,
        strategy: str = "some",
        instruction_key: str = INSTRUCTION_KEY,
        achieved_key: str = ACHIEVED_KEY,
        reward_key: str = PREV_REWARD_KEY,
        success_reward: float = 1.0,
    ) -> None:
        super().__init__(strategy, reward_key)
        self.instruction_key = instruction_key
        self.achieved_key = achieved_key
        self.success_reward = float(success_reward)
        self.keys = (instruction_key, achieved_key, reward_key)
        self.hidden_keys = (achieved_key,)

    def check(self, observation_space: spaces.Space) -> None:
        """Raise a ValueError unless the space has integer instruction and achieved keys."""
        space = _require_dict_keys(observation_space, (self.instruction_key, self.achieved_key), type(self).__name__)
        for key in (self.instruction_key, self.achieved_key):
            sub = space.spaces[key]
            if not isinstance(sub, (spaces.MultiDiscrete, spaces.Box)) or len(sub.shape) != 1:
                raise ValueError(f"Observation key '{key}' must be a 1-d MultiDiscrete of goal tokens, got {sub}")
            if not np.issubdtype(sub.dtype, np.integer):
                raise ValueError(f"Observation key '{key}' must hold integer goal tokens, got dtype {sub.dtype}")

    def _candidates(self, achieved: np.ndarray, real_steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Fresh (step, goal) pairs off the real successes.

        :param achieved: ``(T, m)`` goals achieved on arriving at observation ``t + 1``
        :param real_steps: ``(n,)`` increasing transitions of the real successes
        :return: ``(c,)`` steps and ``(c,)`` goals, sorted by goal then step
        """
        steps, slots = np.nonzero(achieved != EMPTY_GOAL)
        goals = achieved[steps, slots]
        order = np.lexsort((steps, goals))
        steps, goals = steps[order], goals[order]
        distinct = np.ones(len(steps), dtype=bool)
        distinct[1:] = (steps[1:] != steps[:-1]) | (goals[1:] != goals[:-1])
        steps, goals = steps[distinct], goals[distinct]
        previous = np.full(len(steps), -1, dtype=np.int64)
        same_goal = goals[1:] == goals[:-1]
        previous[1:][same_goal] = steps[:-1][same_goal]
        last_success = np.concatenate([[-1], real_steps])[np.searchsorted(real_steps, steps, side="left")]
        keep = (previous <= last_success) & ~np.isin(steps, real_steps)
        return steps[keep], goals[keep]

    def relabel(self, rollout: Rollout) -> Rollout:
        """Relabel ``rollout`` with extra goals drawn from what it achieved (see the class docstring)."""
        instruction = rollout.observations[self.instruction_key][0]
        achieved = rollout.observations[self.achieved_key][1:]
        completed = goal_completion_steps(instruction, achieved)
        real_steps = completed[completed >= 0]
        n_real = len(real_steps)
        cand_steps, cand_goals = self._candidates(achieved, real_steps)
        chosen = self._draw_steps(len(instruction), n_real, np.unique(cand_steps))
        if len(chosen) == 0:
            return rollout
        chosen_goals = np.array([np.random.choice(cand_goals[cand_steps == step]) for step in chosen])
        steps = np.concatenate([real_steps, chosen])
        goals = np.concatenate([instruction[:n_real], chosen_goals])
        new_instruction = instruction.copy()
        new_instruction[: len(steps)] = goals[np.argsort(steps, kind="stable")]
        new_completed = goal_completion_steps(new_instruction, achieved)
        rewards = instruction_rewards(new_instruction, achieved, self.success_reward)
        observations = dict(rollout.observations)
        observations[self.instruction_key] = np.tile(new_instruction, (rollout.length + 1, 1))
        complete = np.count_nonzero(new_completed >= 0) == n_goals(new_instruction)
        return self._finish(rollout, observations, rewards, int(new_completed.max()) + 1, bool(complete))


class GoalEnvRelabeler(HindsightRelabeler):
    """Hindsight relabeling for SB3-style goal envs, as the one-goal case (``k = 1``).

    The env's Dict observation has ``"observation"``, ``"achieved_goal"`` and ``"desired_goal"``,
    and ``compute_reward(achieved_goal, desired_goal, info)`` works on batches as SB3's
    ``HerReplayBuffer`` requires. A rollout already succeeded (``n = 1``) if one of its rewards is the
    success reward, ``compute_reward(g, g)``. Otherwise the strategy draws at most one candidate
    step (any transition); its achieved goal becomes the desired goal at every step, rewards are
    recomputed with ``compute_reward`` (with empty infos), and the rollout is cut at the first step
    paying the success reward (the drawn step, or an earlier one when the env's success threshold
    is met sooner). It then ends terminated if ``terminate_on_success``, else truncated.

    :param compute_reward: the env's ``compute_reward``; must pickle for ``save_replay_buffer``
        (a module-level function does; a bound method pickles its env)
    :param strategy: ``"some"`` (relabel half of the unsuccessful rollouts), ``"all"`` or ``"none"``
    :param reward_key: observation key of the reward input, rewritten when the env has it
    :param terminate_on_success: whether the env ends an episode when the goal is reached
        (SB3's ``BitFlippingEnv`` does; gymnasium-robotics' Fetch envs do not)
    """

    ACHIEVED_GOAL_KEY = "achieved_goal"
    DESIRED_GOAL_KEY = "desired_goal"
    GOAL_ENV_KEYS = ("observation", "achieved_goal", "desired_goal")

    def __init__(
        self,
        compute_reward: Callable[[np.ndarray, np.ndarray, Any], np.ndarray],
        strategy: str = "some",
        reward_key: str = PREV_REWARD_KEY,
        terminate_on_success: bool = True,
    ) -> None:
        super().__init__(strategy, reward_key)
        self.compute_reward = compute_reward
        self.terminate_on_success = terminate_on_success
        self.keys = (self.ACHIEVED_GOAL_KEY, self.DESIRED_GOAL_KEY, reward_key)
        self.hidden_keys = ()

    def check(self, observation_space: spaces.Space) -> None:
        """Raise a ValueError unless the space is a goal env's Dict."""
        _require_dict_keys(observation_space, self.GOAL_ENV_KEYS, type(self).__name__)

    def _rewards(self, achieved: np.ndarray, goal: np.ndarray) -> np.ndarray:
        """``(T,)`` float32 rewards of arriving at ``achieved`` ``(T, *goal_shape)`` when pursuing ``goal``."""
        infos = np.array([{} for _ in range(len(achieved))], dtype=object)
        desired = np.broadcast_to(goal, achieved.shape)
        return np.asarray(self.compute_reward(achieved, desired, infos), dtype=np.float32).reshape(len(achieved))

    def relabel(self, rollout: Rollout) -> Rollout:
        """Relabel ``rollout`` with the goal achieved at a drawn step (see the class docstring)."""
        achieved = rollout.observations[self.ACHIEVED_GOAL_KEY][1:]
        desired = rollout.observations[self.DESIRED_GOAL_KEY]
        success = self._rewards(desired[:1], desired[0])[0]
        n_real = int(np.isclose(rollout.rewards, success).any())
        chosen = self._draw_steps(1, n_real, np.arange(rollout.length))
        if len(chosen) == 0:
            return rollout
        step = int(chosen[0])
        goal = achieved[step]
        rewards = self._rewards(achieved[: step + 1], goal)
        new_success = self._rewards(goal[None], goal)[0]
        hits = np.flatnonzero(np.isclose(rewards, new_success))
        end = int(hits[0]) + 1 if len(hits) > 0 else step + 1
        observations = dict(rollout.observations)
        observations[self.DESIRED_GOAL_KEY] = np.repeat(goal[None], rollout.length + 1, axis=0)
        return self._finish(rollout, observations, rewards, end, self.terminate_on_success)


def visible_space(observation_space: spaces.Space, relabeler: Relabeler | None) -> spaces.Space:
    """``observation_space`` without the keys ``relabeler`` hides from the policy (its ``hidden_keys``)."""
    hidden = tuple(getattr(relabeler, "hidden_keys", ()))
    if not hidden:
        return observation_space
    assert isinstance(observation_space, spaces.Dict)
    return spaces.Dict({k: v for k, v in observation_space.spaces.items() if k not in hidden})
