"""The instruction-following convention shared by the goal envs and the hindsight relabeler.

An instruction-following env has a Dict observation with two integer keys:

* ``"instruction"``: ``MultiDiscrete([n_tokens] * k)``, the sequence of ``k`` goal tokens to reach
  in order. Token 0 is an empty slot; real goals are ``1 .. n_tokens - 1`` and fill the first slots.
  The instruction is the same at every step of a rollout.
* ``"achieved"``: ``MultiDiscrete([n_tokens] * m)``, the goals achieved on arriving at this step
  (0 pads). The policy never sees this key: the relabeler reads it and the replay drops it.

Reward rule (the env computes it live, the relabeler recomputes it after rewriting goals):
the agent works on the first goal not yet completed; arriving at a step whose ``achieved`` holds
that goal pays ``success_reward`` and moves on to the next goal. At most one goal completes per
step. The rollout terminates when the last goal of the instruction is completed.
"""

import numpy as np

EMPTY_GOAL = 0


def goal_completion_steps(instruction: np.ndarray, achieved: np.ndarray) -> np.ndarray:
    """Steps at which each goal of the instruction is completed under the reward rule.

    :param instruction: ``(k,)`` int goal tokens, 0 = empty slot
    :param achieved: ``(T, m)`` int goals achieved on arriving at each step, 0 = pad
    :return: ``(k,)`` int64, the step completing each goal, -1 for goals never completed
        (and for empty slots)
    """
    steps = np.full(len(instruction), -1, dtype=np.int64)
    start = 0
    for slot, goal in enumerate(instruction):
        if goal == EMPTY_GOAL or start >= len(achieved):
            break
        hits = np.flatnonzero((achieved[start:] == goal).any(axis=-1))
        if len(hits) == 0:
            break
        steps[slot] = start + hits[0]
        start = steps[slot] + 1
    return steps


def instruction_rewards(instruction: np.ndarray, achieved: np.ndarray, success_reward: float = 1.0) -> np.ndarray:
    """Reward received on arriving at each step under the reward rule.

    :param instruction: ``(k,)`` goal tokens
    :param achieved: ``(T, m)`` achieved goals per step
    :return: ``(T,)`` float32 rewards
    """
    rewards = np.zeros(len(achieved), dtype=np.float32)
    steps = goal_completion_steps(instruction, achieved)
    rewards[steps[steps >= 0]] = success_reward
    return rewards


def n_goals(instruction: np.ndarray) -> int:
    """Number of real (non-empty) goals in an instruction."""
    return int(np.count_nonzero(np.asarray(instruction) != EMPTY_GOAL))
