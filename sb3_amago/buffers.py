"""Trajectory replay: whole rollouts stored as they come, sampled as windows for one sequence model."""

import warnings
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, ReplayBuffer
from stable_baselines3.common.preprocessing import get_obs_shape
from stable_baselines3.common.vec_env import VecNormalize

from sb3_amago.keys import OBS_KEY
from sb3_amago.relabel import Relabeler, Rollout
from sb3_amago.type_aliases import TrajectoryBatch
from sb3_amago.wrappers import is_structured

try:
    import psutil
except ImportError:  # pragma: no cover
    psutil = None

# Version of the pickled layout (attributes and array meanings); a saved buffer records it and
# AMAGO.load_replay_buffer refuses files of another version. Raise it when the layout changes.
REPLAY_FORMAT_VERSION = 1


def _check_discrete(name: str, value: np.ndarray, low: np.ndarray | int, high: np.ndarray | int) -> None:
    """Raise a ValueError unless ``value`` ``(n_envs, ...)`` holds integers in ``[low, high)`` (bounds per element)."""
    flat = value.reshape(len(value), -1)
    low, high = np.reshape(low, -1), np.reshape(high, -1)
    if np.issubdtype(flat.dtype, np.floating) and not np.array_equal(flat, np.round(flat)):
        raise ValueError(f"{name} holds non-integer values for a discrete space")
    if np.any(flat < low) or np.any(flat >= high):
        raise ValueError(f"{name} holds values outside the space's range [{low}, {high})")


def _check_values(name: str, value: np.ndarray, space: spaces.Space) -> None:
    """Raise a ValueError if ``value`` ``(n_envs, *shape)`` holds values the space cannot (or NaN / inf)."""
    if isinstance(space, spaces.Discrete):
        _check_discrete(name, value, int(space.start), int(space.start + space.n))
    elif isinstance(space, spaces.MultiDiscrete):
        _check_discrete(name, value, space.start, space.start + space.nvec)
    elif isinstance(space, spaces.MultiBinary):
        _check_discrete(name, value, 0, 2)
    elif np.issubdtype(value.dtype, np.floating) and not np.isfinite(value).all():
        raise ValueError(
            f"{name} holds NaN or infinite values: fix the env, or wrap it with "
            "stable_baselines3.common.vec_env.VecCheckNan to find the step that produces them."
        )


class _Store(NamedTuple):
    """The storage arrays once allocated, each ``(buffer_size, n_envs, ...)``."""

    obs: dict[str, np.ndarray]
    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    timeouts: np.ndarray
    time_steps: np.ndarray


@dataclass
class _Windows:
    """A batch of windows in numpy, the fields and shapes of :class:`TrajectoryBatch`."""

    observations: dict[str, np.ndarray]
    actions: np.ndarray
    prev_actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    time_idx: np.ndarray
    real: np.ndarray


class TrajectoryReplayBuffer(ReplayBuffer):
    """Replay of whole rollouts for AMAGO: sample a rollout, then a window of ``max_seq_len + 1`` steps.

    Layout: SB3's ``(buffer_size // n_envs, n_envs, ...)`` arrays, one ring per env column, so
    env streams never mix. Row ``t`` of a rollout holds, with SB3's meaning, observation ``o_t``
    (in the space's own dtype; Dict spaces key by key), the action taken at it (``actions``), the
    reward of that transition (``rewards``), whether the episode ended after it (``dones``) and
    whether that end was a time limit (``timeouts``), plus ``time_steps``, the global time index
    of ``o_t`` in its rollout. Each rollout also keeps its newest observation in the next row
    (the terminal observation once it ended, with zero action and reward), so ``next_obs`` is
    never stored twice: a rollout of ``T`` transitions takes ``T + 1`` rows. This is what
    ``optimize_memory_usage`` does in SB3, so that option is refused as having nothing to save.

    Eviction: when a column is full, its oldest rows are overwritten and a rollout that loses a
    row is dropped whole. The exception is a rollout longer than its column: it keeps its newest
    observations (at most ``buffer_size // n_envs - 1``, the row before them giving the previous
    action and reward), with their global time indices, until later rows overwrite them too.

    Rollouts: an ``add`` with ``done`` closes the env's rollout (termination stops bootstrapping,
    a time limit, ``infos[i]["TimeLimit.truncated"]``, does not, unless
    ``handle_timeout_termination=False``). An ``add`` whose ``obs`` is not the ``next_obs`` the
    previous ``add`` gave for that env (the env was reset behind the buffer's back, as a new
    ``learn`` call does) closes it as still running and starts a new one.

    Sampling: rollouts uniformly (or in proportion to their length), those still running
    included; a window of up to ``max_seq_len + 1`` observations at a uniformly drawn start
    (every start reachable; a rollout shorter than that is taken whole); windows padded on the
    right to the longest in the batch. Randomness comes from the global ``np.random``, as in SB3.
    Storage is allocated on the first ``add``. ``hidden_keys`` lists the observation keys dropped
    from sampled batches (the relabeler's), which the policy must not see either.

    :param buffer_size: capacity in rows (observations), split evenly between the env columns
    :param observation_space: observation space
    :param action_space: action space
    :param device: device of the sampled tensors
    :param n_envs: number of parallel envs
    :param optimize_memory_usage: must be False (see above)
    :param handle_timeout_termination: time-limit ends bootstrap (SB3's meaning); if False every
        end of episode is a termination
    :param max_seq_len: ``L``, windows hold up to ``L + 1`` observations (``L`` loss positions)
    :param relabeler: applied to every sampled rollout before its window is cut; the observation
        keys it hides are dropped from the batch
    :param sample_by_length: draw rollouts in proportion to their length instead of uniformly
    """

    def __init__(
        self,
        buffer_size: int,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: th.device | str = "auto",
        n_envs: int = 1,
        optimize_memory_usage: bool = False,
        handle_timeout_termination: bool = True,
        max_seq_len: int = 64,
        relabeler: Relabeler | None = None,
        sample_by_length: bool = False,
    ) -> None:
        # ReplayBuffer.__init__ would allocate every array now: skip it, storage waits for the first add.
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
        if optimize_memory_usage:
            raise ValueError(
                "TrajectoryReplayBuffer stores every observation once already (the next observation is the "
                "following row of the rollout): use optimize_memory_usage=False."
            )
        if is_structured(observation_space):
            raise ValueError(
                f"The replay stores flat observation spaces, got {observation_space}: wrap the env with "
                "sb3_amago.wrappers.FlatDictObservation (AMAGO does so itself)."
            )
        self.buffer_size = buffer_size // n_envs
        if self.buffer_size < 2:
            raise ValueError(f"buffer_size must hold at least 2 rows per env, got {buffer_size} for {n_envs} envs")
        if max_seq_len < 1:
            raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
        self.optimize_memory_usage = False
        self.handle_timeout_termination = handle_timeout_termination
        self.max_seq_len = int(max_seq_len)
        self.sample_by_length = sample_by_length
        self.relabeler = relabeler
        self._obs_spaces: dict[str, spaces.Space] = (
            dict(observation_space.spaces) if isinstance(observation_space, spaces.Dict) else {OBS_KEY: observation_space}
        )
        shapes = get_obs_shape(observation_space)
        self._obs_shapes: dict[str, tuple[int, ...]] = shapes if isinstance(shapes, dict) else {OBS_KEY: shapes}
        self._action_dtype = self._maybe_cast_dtype(action_space.dtype)
        hidden: tuple[str, ...] = ()
        if relabeler is not None:
            relabeler.check(observation_space)
            hidden = tuple(relabeler.hidden_keys)
        self.hidden_keys = hidden
        self.format_version = REPLAY_FORMAT_VERSION
        self.reset()

    # ------------------------------------------------------------------ storage

    @property  # SB3's buffers hold an array here; this one allocates at the first add
    def observations(self) -> np.ndarray | dict[str, np.ndarray] | None:  # type: ignore[override]
        """``(buffer_size, n_envs, *obs_shape)``, or a dict of such arrays; None before the first add."""
        if self._obs is None or isinstance(self.observation_space, spaces.Dict):
            return self._obs
        return self._obs[OBS_KEY]

    def reset(self) -> None:
        """Drop every rollout and free the storage."""
        # Allocated at the first add (SB3's buffers declare them as arrays from the start).
        self._obs: dict[str, np.ndarray] | None = None
        self.actions: np.ndarray | None = None  # type: ignore[assignment]
        self.rewards: np.ndarray | None = None  # type: ignore[assignment]
        self.dones: np.ndarray | None = None  # type: ignore[assignment]
        self.timeouts: np.ndarray | None = None  # type: ignore[assignment]
        self.time_steps: np.ndarray | None = None
        # Per env column: absolute index (counting every row ever written) of its newest row,
        # the time index of the observation there, and the table entry of its running rollout.
        self._head = np.full(self.n_envs, -1, dtype=np.int64)
        self._time = np.zeros(self.n_envs, dtype=np.int64)
        self._running = np.full(self.n_envs, -1, dtype=np.int64)
        # Rollout table: column, absolute first row, absolute end row (exclusive).
        self._table = np.zeros((0, 3), dtype=np.int64)
        self._n_table = 0
        # Per env column (SB3's buffers keep one int and one bool for all columns).
        self.pos = np.zeros(self.n_envs, dtype=np.int64)  # type: ignore[assignment]
        self.full = np.zeros(self.n_envs, dtype=bool)  # type: ignore[assignment]

    def _allocate(self) -> None:
        rows = (self.buffer_size, self.n_envs)
        self._obs = {key: np.zeros(rows + self._obs_shapes[key], dtype=space.dtype) for key, space in self._obs_spaces.items()}
        self.actions = np.zeros((*rows, self.action_dim), dtype=self._action_dtype)
        self.rewards = np.zeros(rows, dtype=np.float32)
        self.dones = np.zeros(rows, dtype=bool)
        self.timeouts = np.zeros(rows, dtype=bool)
        self.time_steps = np.zeros(rows, dtype=np.int32)
        if psutil is not None and self.nbytes() > psutil.virtual_memory().available:
            warnings.warn(
                f"The replay buffer needs {self.nbytes() / 1e9:.2f} GB, more than the "
                f"{psutil.virtual_memory().available / 1e9:.2f} GB of memory available"
            )

    def _store(self) -> _Store:
        """The storage arrays, allocated at the first add (a RuntimeError before it)."""
        if self._obs is None or self.actions is None or self.rewards is None:
            raise RuntimeError("The replay buffer holds no steps yet: add steps first.")
        assert self.dones is not None and self.timeouts is not None and self.time_steps is not None
        return _Store(self._obs, self.actions, self.rewards, self.dones, self.timeouts, self.time_steps)

    def nbytes(self) -> int:
        """Bytes held by the storage and the rollout table (0 before the first add)."""
        arrays = [self.actions, self.rewards, self.dones, self.timeouts, self.time_steps, self._table]
        if self._obs is not None:
            arrays += list(self._obs.values())
        return int(sum(array.nbytes for array in arrays if array is not None))

    # ------------------------------------------------------------------ adding

    def _validated_obs(self, name: str, obs: np.ndarray | dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``obs`` key by key as ``(n_envs, *shape)`` arrays, or a ValueError naming what is wrong."""
        if isinstance(self.observation_space, spaces.Dict):
            if not isinstance(obs, dict):
                raise ValueError(f"{name} must be a dict for a Dict observation space, got {type(obs).__name__}")
            missing = [key for key in self._obs_spaces if key not in obs]
            if missing:
                raise ValueError(f"{name} lacks the keys {missing}")
            items = {key: obs[key] for key in self._obs_spaces}
        else:
            items = {OBS_KEY: np.asarray(obs)}
        validated = {}
        for key, value in items.items():
            label = name if key == OBS_KEY and len(items) == 1 else f"{name}['{key}']"
            value = np.asarray(value)
            shape = (self.n_envs, *self._obs_shapes[key])
            if isinstance(self._obs_spaces[key], spaces.Discrete) and value.size == self.n_envs:
                value = value.reshape(shape)
            if value.shape != shape:
                raise ValueError(f"{label} has shape {value.shape}, expected {shape}")
            _check_values(label, value, self._obs_spaces[key])
            validated[key] = value
        return validated

    def _validated(
        self,
        obs: np.ndarray | dict[str, np.ndarray],
        next_obs: np.ndarray | dict[str, np.ndarray],
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        obs_ = self._validated_obs("obs", obs)
        next_obs_ = self._validated_obs("next_obs", next_obs)
        action = np.asarray(action)
        if action.size != self.n_envs * self.action_dim:
            raise ValueError(f"action has shape {action.shape}, expected ({self.n_envs}, {self.action_dim})")
        action = action.reshape(self.n_envs, self.action_dim)
        if isinstance(self.action_space, spaces.Box) and not np.isfinite(action).all():
            raise ValueError("action holds NaN or inf")
        _check_values("action", action, self.action_space)
        reward = np.asarray(reward, dtype=np.float32)
        if reward.size != self.n_envs:
            raise ValueError(f"reward has shape {reward.shape}, expected ({self.n_envs},)")
        if not np.isfinite(reward).all():
            raise ValueError("reward holds NaN or inf")
        done = np.asarray(done)
        if done.size != self.n_envs:
            raise ValueError(f"done has shape {done.shape}, expected ({self.n_envs},)")
        if len(infos) != self.n_envs:
            raise ValueError(f"infos has {len(infos)} entries, expected {self.n_envs}")
        done = done.reshape(self.n_envs).astype(bool)
        timeout = np.zeros(self.n_envs, dtype=bool)
        if self.handle_timeout_termination:
            timeout = done & np.array([bool(info.get("TimeLimit.truncated", False)) for info in infos])
        return obs_, next_obs_, action, reward.reshape(self.n_envs), done, timeout

    def add(
        self,
        obs: np.ndarray | dict[str, np.ndarray],
        next_obs: np.ndarray | dict[str, np.ndarray],
        action: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> None:
        """Store one step of every env (SB3's ``ReplayBuffer.add`` signature and shapes).

        :param obs: ``(n_envs, *obs_shape)`` or a dict of such, the observations acted on
        :param next_obs: the same, the observations reached (the terminal one where ``done``)
        :param action: ``(n_envs, action_dim)`` in the buffer's representation
        :param reward: ``(n_envs,)``
        :param done: ``(n_envs,)``
        :param infos: ``n_envs`` dicts; ``"TimeLimit.truncated"`` marks a time-limit end
        :raises ValueError: on input not matching the spaces, NaN / inf observations or rewards;
            the stored content is then unchanged
        """
        obs_, next_obs_, action, reward, done, timeout = self._validated(obs, next_obs, action, reward, done, infos)
        if self._obs is None:
            self._allocate()
        store = self._store()
        envs = np.arange(self.n_envs)
        self._close_broken_streams(obs_)
        starting = self._running < 0
        rows = np.where(starting, self._head + 1, self._head)
        self._time[starting] = 0
        for env in np.flatnonzero(starting):
            self._running[env] = self._new_rollout(int(env), int(rows[env]))
        here, after = rows % self.buffer_size, (rows + 1) % self.buffer_size
        for key, array in store.obs.items():
            array[here, envs] = obs_[key]
            array[after, envs] = next_obs_[key]
        store.actions[here, envs] = action
        store.rewards[here, envs] = reward
        store.dones[here, envs] = done
        store.timeouts[here, envs] = timeout
        store.time_steps[here, envs] = self._time
        store.actions[after, envs] = 0
        store.rewards[after, envs] = 0.0
        store.dones[after, envs] = False
        store.timeouts[after, envs] = False
        store.time_steps[after, envs] = self._time + 1
        self._head = rows + 1
        self._time += 1
        self._table[self._running, 2] = self._head + 1
        self._running[done] = -1
        self.pos = (self._head + 1) % self.buffer_size  # type: ignore[assignment]  # per column, see reset
        self.full = self._head + 1 >= self.buffer_size  # type: ignore[assignment]

    def end_running_rollouts(self) -> None:
        """End every env's running rollout where it stands, unfinished (the envs are restarting):
        each env's next step starts a new rollout."""
        self._running[:] = -1

    def _close_broken_streams(self, obs: dict[str, np.ndarray]) -> None:
        """Close running rollouts whose newest observation is not the ``obs`` now given."""
        running = np.flatnonzero(self._running >= 0)
        if len(running) == 0:
            return
        store = self._store()
        here = self._head[running] % self.buffer_size
        same = np.ones(len(running), dtype=bool)
        for key, array in store.obs.items():
            stored = array[here, running]
            given = obs[key][running].astype(stored.dtype)
            same &= (stored == given).reshape(len(running), -1).all(axis=1)
        self._running[running[~same]] = -1

    def _new_rollout(self, env: int, start: int) -> int:
        """Append a rollout of column ``env`` starting at absolute row ``start``; return its table index."""
        if self._n_table == len(self._table):
            self._compact()
        if self._n_table == len(self._table):
            grown = np.zeros((max(64, 2 * len(self._table)), 3), dtype=np.int64)
            grown[: self._n_table] = self._table[: self._n_table]
            self._table = grown
        index = self._n_table
        self._table[index] = (env, start, start + 1)
        self._n_table += 1
        return index

    def _live(self) -> np.ndarray:
        """``(n_table,)`` bool, the table entries whose rollout can still be sampled.

        A rollout is live while its first row is intact, or, if it is longer than its column (it
        then lost its first rows while running), while at least two of its rows are.
        """
        col, start, end = self._table[: self._n_table].T
        oldest = self._head[col] - self.buffer_size + 1
        return (start >= oldest) | ((end - start > self.buffer_size) & (end - oldest >= 2))

    def _compact(self) -> None:
        """Drop the table entries of evicted rollouts."""
        keep = np.flatnonzero(self._live())
        new_index = np.full(self._n_table, -1, dtype=np.int64)
        new_index[keep] = np.arange(len(keep))
        self._table[: len(keep)] = self._table[keep]
        self._n_table = len(keep)
        running = self._running >= 0
        self._running[running] = new_index[self._running[running]]

    # ------------------------------------------------------------------ sampling

    def _rollouts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The rollouts that can be sampled.

        :return: columns, first intact absolute rows, first window offsets (1 for a rollout that
            lost its beginning: its first intact row only gives the previous action and reward)
            and numbers of intact observations, each ``(R,)``
        """
        table = self._table[: self._n_table][self._live()]
        col, start, end = table[:, 0], table[:, 1], table[:, 2]
        oldest = self._head[col] - self.buffer_size + 1
        lost_start = start < oldest
        first_row = np.where(lost_start, oldest, start)
        return col, first_row, lost_start.astype(np.int64), end - first_row

    def size(self) -> int:
        """Number of transitions that can be sampled."""
        _, _, first, n_obs = self._rollouts()
        return int(np.sum(n_obs - first - 1))

    def num_rollouts(self) -> int:
        """Number of rollouts that can be sampled, running ones included."""
        return int(np.count_nonzero(self._live()))

    def _windows(self, n_obs: np.ndarray, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Draw window offsets ``(B,)`` and lengths ``(B,)`` in rollouts of ``n_obs`` observations."""
        available = n_obs - first
        length = np.minimum(available, self.max_seq_len + 1)
        return first + np.random.randint(0, available - length + 1), length

    def _gather(self, cols: np.ndarray, starts: np.ndarray, length: np.ndarray, keys: list[str]) -> _Windows:
        """Windows of ``length`` ``(B,)`` observations from absolute rows ``starts`` ``(B,)`` of columns ``cols``.

        One gather per array over a ``(B, L + 2)`` grid of rows: the row before each window (for the
        previous action, reward and end flags) and the window, padding repeating its last row.
        """
        steps = np.arange(-1, int(length.max()))
        rows = (starts[:, None] + np.minimum(steps, length[:, None] - 1)) % self.buffer_size
        col = cols[:, None]
        store = self._store()
        time_idx = store.time_steps[rows[:, 1:], col].astype(np.int64)
        started = time_idx > 0
        actions = store.actions[rows, col].astype(np.float32)
        before = rows[:, :-1]
        done = store.dones[before, col] & started
        timeout = store.timeouts[before, col]
        return _Windows(
            observations={key: store.obs[key][rows[:, 1:], col] for key in keys},
            actions=actions[:, 1:],
            prev_actions=actions[:, :-1] * started[..., None],
            rewards=store.rewards[before, col] * started,
            terminated=(done & ~timeout).astype(np.float32),
            truncated=(done & timeout).astype(np.float32),
            time_idx=time_idx,
            real=steps[None, 1:] < length[:, None],
        )

    def _read_rollout(self, col: int, first_row: int, n_obs: int, keys: list[str]) -> Rollout:
        """A copy of the ``n_obs`` rows of a rollout from ``first_row``, with the observation ``keys``."""
        rows = (first_row + np.arange(n_obs)) % self.buffer_size
        store = self._store()
        last = rows[-2] if n_obs > 1 else rows[-1]
        ended = n_obs > 1 and bool(store.dones[last, col])
        timeout = bool(store.timeouts[last, col])
        return Rollout(
            observations={key: store.obs[key][rows, col] for key in keys},
            actions=store.actions[rows[:-1], col],
            rewards=store.rewards[rows[:-1], col],
            terminated=ended and not timeout,
            truncated=ended and timeout,
            start_time=int(store.time_steps[rows[0], col]),
        )

    @staticmethod
    def _write_rollout(windows: _Windows, index: int, rollout: Rollout, offset: int, length: int) -> None:
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

    def _relabeled_windows(self, cols: np.ndarray, first_rows: np.ndarray, first: np.ndarray, n_obs: np.ndarray) -> _Windows:
        """Relabel each drawn rollout, then cut its window; relabeled keys, actions and rewards come from the rollout."""
        assert self.relabeler is not None
        relabel_keys = [key for key in self.relabeler.keys if key in self._obs_spaces]
        rollouts = [
            self.relabeler.relabel(self._read_rollout(col, row, n, relabel_keys))
            for col, row, n in zip(cols, first_rows, n_obs)
        ]
        offsets, length = self._windows(np.array([rollout.length + 1 for rollout in rollouts]), first)
        visible = [key for key in self._obs_spaces if key not in self.hidden_keys]
        windows = self._gather(cols, first_rows + offsets, length, [key for key in visible if key not in relabel_keys])
        for key in visible:
            if key in relabel_keys:
                store = self._store().obs[key]
                windows.observations[key] = np.zeros((len(cols), int(length.max()), *store.shape[2:]), dtype=store.dtype)
        for index, rollout in enumerate(rollouts):
            self._write_rollout(windows, index, rollout, int(offsets[index]), int(length[index]))
        return windows

    # Windows of whole rollouts, not SB3's batches of single transitions.
    def sample(self, batch_size: int, env: VecNormalize | None = None) -> TrajectoryBatch:  # type: ignore[override]
        """Draw ``batch_size`` windows (see the class docstring for the alignment).

        :param batch_size: ``B``
        :param env: a VecNormalize to normalise observations and rewards with, as SB3 does
        :return: tensors on the buffer's device, padded to the longest window in the batch
        """
        cols, first_rows, first, n_obs = self._rollouts()
        if len(cols) == 0:
            raise ValueError("The replay buffer holds no rollout yet: add steps before sampling.")
        if self.sample_by_length:
            cumulative = np.cumsum(n_obs - first)
            picked = np.searchsorted(cumulative, np.random.random(batch_size) * cumulative[-1], side="right")
        else:
            picked = np.random.randint(0, len(cols), size=batch_size)
        cols, first_rows, first, n_obs = cols[picked], first_rows[picked], first[picked], n_obs[picked]
        if self.relabeler is None:
            offsets, length = self._windows(n_obs, first)
            keys = [key for key in self._obs_spaces if key not in self.hidden_keys]
            windows = self._gather(cols, first_rows + offsets, length, keys)
        else:
            windows = self._relabeled_windows(cols, first_rows, first, n_obs)
        return self._to_batch(windows, env)

    def _to_batch(self, windows: _Windows, env: VecNormalize | None) -> TrajectoryBatch:
        """Normalise, zero the padding and move to the device."""
        observations: dict[str, np.ndarray] = windows.observations
        if env is not None:
            if isinstance(self.observation_space, spaces.Dict):
                observations = cast(dict[str, np.ndarray], self._normalize_obs(observations, env))
            else:
                observations = {OBS_KEY: cast(np.ndarray, self._normalize_obs(observations[OBS_KEY], env))}
        rewards = self._normalize_reward(windows.rewards, env)
        padding = ~windows.real
        arrays = [
            *observations.values(),
            windows.actions,
            windows.prev_actions,
            rewards,
            windows.terminated,
            windows.truncated,
        ]
        for array in arrays:
            array[padding] = 0
        windows.time_idx[padding] = 0

        def to_device(array: np.ndarray) -> th.Tensor:
            return th.as_tensor(array, device=self.device)

        obs_tensors = {key: to_device(value) for key, value in observations.items()}
        return TrajectoryBatch(
            observations=obs_tensors if isinstance(self.observation_space, spaces.Dict) else obs_tensors[OBS_KEY],
            actions=to_device(windows.actions),
            prev_actions=to_device(windows.prev_actions),
            rewards=to_device(rewards),
            terminated=to_device(windows.terminated),
            truncated=to_device(windows.truncated),
            time_idx=to_device(windows.time_idx),
            real=to_device(windows.real),
        )
