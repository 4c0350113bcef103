"""The bridge between the replay and a relabeler (:mod:`sb3_amago.relabel`): each sampled rollout
is read out of storage as a :class:`~sb3_amago.relabel.Rollout` (a copy, with only the keys the
relabeler reads), relabeled, and its window is cut from the result, so that the stored data never
changes and every sample is relabeled afresh.
"""

from typing import Protocol

import numpy as np

from sb3_amago.relabel import Relabeler, Rollout
from sb3_amago.rollout_index import Spans
from sb3_amago.type_aliases import ReplayStore, Windows


class SampledReplay(Protocol):
    """What the bridge reads of :class:`~sb3_amago.buffers.TrajectoryReplayBuffer`."""

    hidden_keys: tuple[str, ...]

    @property
    def obs_keys(self) -> list[str]: ...

    def store_of(self, protected: bool) -> tuple[ReplayStore, int]: ...

    def draw_windows(self, n_obs: np.ndarray, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def gather(
        self, cols: np.ndarray, starts: np.ndarray, length: np.ndarray, keys: list[str], protected: bool = False
    ) -> Windows: ...


def read_rollout(store: ReplayStore, rows: int, col: int, first_row: int, n_obs: int, keys: list[str]) -> Rollout:
    """A copy of the ``n_obs`` rows of a rollout of column ``col`` from absolute row ``first_row``
    (rings of ``rows`` rows), with the observation ``keys``."""
    ring = (first_row + np.arange(n_obs)) % rows
    last = ring[-2] if n_obs > 1 else ring[-1]
    ended = n_obs > 1 and bool(store.dones[last, col])
    timeout = bool(store.timeouts[last, col])
    return Rollout(
        observations={key: store.obs[key][ring, col] for key in keys},
        actions=store.actions[ring[:-1], col],
        rewards=store.rewards[ring[:-1], col],
        terminated=ended and not timeout,
        truncated=ended and timeout,
        start_time=int(store.time_steps[ring[0], col]),
    )


def write_rollout(windows: Windows, index: int, rollout: Rollout, offset: int, length: int) -> None:
    """Overwrite window ``index`` with what ``rollout`` holds for observations ``offset .. offset + length - 1``."""
    t_end = rollout.length
    actions = np.zeros((t_end + 2, windows.actions.shape[-1]), dtype=np.float32)
    actions[1 : t_end + 1] = rollout.actions
    rewards = np.zeros(t_end + 1, dtype=np.float32)
    rewards[1:] = rollout.rewards
    window = slice(offset, offset + length)
    for key, value in windows.observations.items():
        if key in rollout.observations:
            value[index, :length] = rollout.observations[key][window]
    windows.actions[index, :length] = actions[offset + 1 : offset + length + 1]
    windows.prev_actions[index, :length] = actions[window]
    windows.rewards[index, :length] = rewards[window]
    windows.terminated[index, :length] = 0.0
    windows.truncated[index, :length] = 0.0
    if offset + length == t_end + 1:
        windows.terminated[index, length - 1] = float(rollout.terminated)
        windows.truncated[index, length - 1] = float(rollout.truncated)


def relabeled_windows(replay: SampledReplay, relabeler: Relabeler, spans: Spans, protected: bool = False) -> Windows:
    """Relabel each drawn rollout of ``spans`` (the protected rollouts' if ``protected``), then cut its
    window: the relabeled keys, the actions and the rewards come from the relabeled rollout, the
    other keys from storage."""
    store, rows = replay.store_of(protected)
    relabel_keys = [key for key in relabeler.keys if key in replay.obs_keys]
    rollouts = [
        relabeler.relabel(read_rollout(store, rows, col, row, n, relabel_keys))
        for col, row, n in zip(spans.cols, spans.first_rows, spans.n_obs)
    ]
    offsets, length = replay.draw_windows(np.array([rollout.length + 1 for rollout in rollouts]), spans.first)
    visible = [key for key in replay.obs_keys if key not in replay.hidden_keys]
    windows = replay.gather(
        spans.cols, spans.first_rows + offsets, length, [key for key in visible if key not in relabel_keys], protected
    )
    for key in visible:
        if key in relabel_keys:
            stored = store.obs[key]
            windows.observations[key] = np.zeros((len(spans.cols), int(length.max()), *stored.shape[2:]), dtype=stored.dtype)
    for index, rollout in enumerate(rollouts):
        write_rollout(windows, index, rollout, int(offsets[index]), int(length[index]))
    return windows
