"""Named containers passed between the replay buffer, the policy and the algorithm."""

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch as th

# An observation batch: a tensor, or a dict of tensors for Dict observation spaces.
TensorObs = th.Tensor | dict[str, th.Tensor]


class TrajectoryBatch(NamedTuple):
    """A batch of ``B`` windows of ``L + 1`` consecutive steps cut from stored rollouts.

    Position ``i`` of a window holds observation ``o_i`` and everything known on arriving at it.
    The loss at position ``i`` uses ``(o_i, a_i)`` and bootstraps from ``o_{i+1}``, so it counts
    only where ``real[:, i + 1]`` is True. Padding is on the right.

    observations: ``(B, L + 1, *obs_shape)`` in the observation space's own dtype (uint8 images stay
        uint8) or a dict of such tensors (Dict spaces, the achieved-goal key already removed).
    actions: ``(B, L + 1, action_dim)`` float, the action taken at ``o_i`` in the buffer's
        representation (Discrete: the index; MultiDiscrete: the indices; Box: scaled to [-1, 1]).
        The last real position of a finished rollout (its final observation) holds zeros.
    prev_actions: ``(B, L + 1, action_dim)``, the action that led to ``o_i`` (zeros where
        ``time_idx == 0``).
    rewards: ``(B, L + 1)`` float, the reward received on arriving at ``o_i`` (0 at ``time_idx == 0``).
    terminated: ``(B, L + 1)`` float 0/1, ``o_i`` is a true terminal state (no bootstrapping).
    truncated: ``(B, L + 1)`` float 0/1, the rollout was cut by a time limit at ``o_i``.
    time_idx: ``(B, L + 1)`` int64, the global step index of ``o_i`` in its rollout.
    real: ``(B, L + 1)`` bool, True for real (non-padding) positions.
    """

    observations: TensorObs
    actions: th.Tensor
    prev_actions: th.Tensor
    rewards: th.Tensor
    terminated: th.Tensor
    truncated: th.Tensor
    time_idx: th.Tensor
    real: th.Tensor


class ReplayStore(NamedTuple):
    """The replay's storage arrays once allocated, each ``(rows, n_envs, ...)`` (one ring per env
    column; see :class:`~sb3_amago.buffers.TrajectoryReplayBuffer` for what a row holds)."""

    obs: dict[str, np.ndarray]
    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    timeouts: np.ndarray
    time_steps: np.ndarray


@dataclass
class Windows:
    """A batch of windows in numpy, before it becomes a :class:`TrajectoryBatch`: the same fields
    and shapes (observations as a dict by key)."""

    observations: dict[str, np.ndarray]
    actions: np.ndarray
    prev_actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    time_idx: np.ndarray
    real: np.ndarray
