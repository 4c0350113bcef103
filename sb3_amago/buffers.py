"""Trajectory replay: whole rollouts stored as they come, sampled as windows for one sequence model.

The replay's parts: :mod:`sb3_amago.validation` checks each step before it is stored,
:mod:`sb3_amago.rollout_index` keeps where the rollouts lie, and :mod:`sb3_amago.relabel_windows`
hands sampled rollouts to a relabeler.
"""

import warnings
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.buffers import BaseBuffer, ReplayBuffer
from stable_baselines3.common.preprocessing import get_obs_shape
from stable_baselines3.common.vec_env import VecNormalize

from sb3_amago.keys import OBS_KEY
from sb3_amago.relabel import Relabeler, Rollout
from sb3_amago.relabel_windows import read_rollout, relabeled_windows
from sb3_amago.rollout_index import RolloutIndex, Spans
from sb3_amago.type_aliases import ReplayStore, TrajectoryBatch, Windows
from sb3_amago.validation import StepLayout
from sb3_amago.wrappers import is_structured

try:
    import psutil
except ImportError:  # pragma: no cover
    psutil = None

# Version of the pickled layout (attributes and array meanings); a saved buffer records it and
# AMAGO.load_replay_buffer refuses files of another version. Raise it when the layout changes, and
# upgrade the earlier layouts in TrajectoryReplayBuffer.__setstate__ where the data allows it.
# Version 2: the rollout bookkeeping in a RolloutIndex, the step shapes in a StepLayout (version 1
# kept both as attributes of the buffer, and is upgraded when unpickled).
# Version 3: protected rollouts, in a store of their own beside the rings, and protected_share
# (version 2 had neither, and is upgraded when unpickled).
REPLAY_FORMAT_VERSION = 3

#: The fewest rows a column keeps, whatever ``buffer_size``: one transition (the observation acted
#: on and the one reached).
MIN_ROWS_PER_ENV = 2


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
    ``optimize_memory_usage`` asks of SB3's replay, so the option changes nothing here.

    Eviction: when a column is full, its oldest rows are overwritten and a rollout that loses a
    row is dropped whole. The exception is a rollout longer than its column: it keeps its newest
    observations (at most ``buffer_size // n_envs - 1``, the row before them giving the previous
    action and reward), with their global time indices, until later rows overwrite them too.

    Rollouts: an ``add`` with ``done`` closes the env's rollout (termination stops bootstrapping,
    a time limit, ``infos[i]["TimeLimit.truncated"]``, does not, unless
    ``handle_timeout_termination=False``). An ``add`` whose ``obs`` is not the ``next_obs`` the
    previous ``add`` gave for that env (the env was reset behind the buffer's back, as a new
    ``learn`` call does) closes it as still running and starts a new one.

    Datasets: :meth:`add_rollouts` stores whole finished rollouts at once, each validated as the
    steps of ``add`` are. Into the rings (evicted like collected ones), or, ``protected``, into a
    store beside them that eviction never touches (its rows add to the replay's memory; it holds
    at most ``buffer_size`` rows).

    Sampling: rollouts uniformly (or in proportion to their length), those still running and the
    protected ones included (or, with ``protected_share``, that share of each batch from the
    protected rollouts and the rest from the others); then a window of up to ``max_seq_len + 1``
    observations: a rollout that fits is taken whole, a longer one from a uniformly drawn
    transition, cut short at the rollout's end, so that its last steps are trained on as often as
    its middle (:meth:`draw_windows`); windows padded on the right to the longest in the batch.
    Randomness comes from the global ``np.random``, as in SB3.
    Storage is allocated on the first ``add``. ``hidden_keys`` lists the observation keys dropped
    from sampled batches (the relabeler's), which the policy must not see either.

    :param buffer_size: capacity in rows (observations), split evenly between the env columns; each
        column keeps at least :data:`MIN_ROWS_PER_ENV` rows (one transition), as SB3's replay keeps
        at least one transition per env
    :param observation_space: observation space
    :param action_space: action space
    :param device: device of the sampled tensors
    :param n_envs: number of parallel envs
    :param optimize_memory_usage: SB3's option, accepted either way: this replay always stores each
        observation once (see above); the attribute stays False, as nothing differs
    :param handle_timeout_termination: time-limit ends bootstrap (SB3's meaning); if False every
        end of episode is a termination
    :param max_seq_len: ``L``, windows hold up to ``L + 1`` observations (``L`` loss positions)
    :param relabeler: applied to every sampled rollout before its window is cut; the observation
        keys it hides are dropped from the batch
    :param sample_by_length: draw rollouts in proportion to their length instead of uniformly
    :param protected_share: if set, the share of each batch drawn from the protected rollouts
        (rounded to whole windows; all of it while only protected rollouts are stored, none while
        there are none), the rest from the other rollouts; None: every rollout alike
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
        protected_share: float | None = None,
    ) -> None:
        # ReplayBuffer.__init__ would allocate every array now: skip it, storage waits for the first add.
        BaseBuffer.__init__(self, buffer_size, observation_space, action_space, device, n_envs=n_envs)
        if is_structured(observation_space):
            raise ValueError(
                f"The replay stores flat observation spaces, got {observation_space}: wrap the env with "
                "sb3_amago.wrappers.FlatDictObservation (AMAGO does so itself)."
            )
        self.buffer_size = max(buffer_size // n_envs, MIN_ROWS_PER_ENV)
        if max_seq_len < 1:
            raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
        if protected_share is not None and not 0.0 <= float(protected_share) <= 1.0:
            raise ValueError(f"protected_share must lie in [0, 1] (a share of each batch), got {protected_share}")
        self.protected_share = None if protected_share is None else float(protected_share)
        self.optimize_memory_usage = False
        self.handle_timeout_termination = handle_timeout_termination
        self.max_seq_len = int(max_seq_len)
        self.sample_by_length = sample_by_length
        self.relabeler = relabeler
        self.layout = step_layout(observation_space, action_space, self.action_dim, n_envs, handle_timeout_termination)
        self._action_dtype = self._maybe_cast_dtype(action_space.dtype)
        hidden: tuple[str, ...] = ()
        if relabeler is not None:
            relabeler.check(observation_space)
            hidden = tuple(relabeler.hidden_keys)
        self.hidden_keys = hidden
        self.format_version = REPLAY_FORMAT_VERSION
        self.reset()

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickle, upgrading the layouts of format versions 1 and 2 (see :data:`REPLAY_FORMAT_VERSION`)."""
        if state.get("format_version") == 1:
            state = upgraded_from_version_1(state)
        if state.get("format_version") == 2:
            state = {**state, "_protected": None, "protected_share": None, "format_version": REPLAY_FORMAT_VERSION}
        self.__dict__.update(state)

    # ------------------------------------------------------------------ storage

    @property  # SB3's buffers hold an array here; this one allocates at the first add
    def observations(self) -> np.ndarray | dict[str, np.ndarray] | None:  # type: ignore[override]
        """``(buffer_size, n_envs, *obs_shape)``, or a dict of such arrays; None before the first add."""
        if self._obs is None or isinstance(self.observation_space, spaces.Dict):
            return self._obs
        return self._obs[OBS_KEY]

    @property
    def obs_keys(self) -> list[str]:
        """The observation keys, in the space's order (:data:`~sb3_amago.keys.OBS_KEY` for a non-Dict space)."""
        return list(self.layout.obs_spaces)

    def reset(self) -> None:
        """Drop every rollout and free the storage."""
        # Allocated at the first add (SB3's buffers declare them as arrays from the start).
        self._obs: dict[str, np.ndarray] | None = None
        self.actions: np.ndarray | None = None  # type: ignore[assignment]
        self.rewards: np.ndarray | None = None  # type: ignore[assignment]
        self.dones: np.ndarray | None = None  # type: ignore[assignment]
        self.timeouts: np.ndarray | None = None  # type: ignore[assignment]
        self.time_steps: np.ndarray | None = None
        self._protected: ReplayStore | None = None  # the protected rollouts' storage, one column
        self.index = RolloutIndex(self.n_envs, self.buffer_size)
        # Per env column (SB3's buffers keep one int and one bool for all columns).
        self.pos = np.zeros(self.n_envs, dtype=np.int64)  # type: ignore[assignment]
        self.full = np.zeros(self.n_envs, dtype=bool)  # type: ignore[assignment]

    def _allocate(self) -> None:
        rows = (self.buffer_size, self.n_envs)
        shapes = self.layout.obs_shapes
        self._obs = {key: np.zeros(rows + shapes[key], dtype=space.dtype) for key, space in self.layout.obs_spaces.items()}
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

    def store(self) -> ReplayStore:
        """The storage arrays, allocated at the first add (a RuntimeError before it)."""
        if self._obs is None or self.actions is None or self.rewards is None:
            raise RuntimeError("The replay buffer holds no steps yet: add steps first.")
        assert self.dones is not None and self.timeouts is not None and self.time_steps is not None
        return ReplayStore(self._obs, self.actions, self.rewards, self.dones, self.timeouts, self.time_steps)

    def store_of(self, protected: bool) -> tuple[ReplayStore, int]:
        """The storage of the rings (``protected`` False) or of the protected rollouts, and its rows per column."""
        if not protected:
            return self.store(), self.buffer_size
        if self._protected is None:
            raise RuntimeError("The replay buffer holds no protected rollouts.")
        return self._protected, len(self._protected.rewards)

    def nbytes(self) -> int:
        """Bytes held by the storage and the rollout tables (0 before the first add)."""
        arrays = [self.actions, self.rewards, self.dones, self.timeouts, self.time_steps, self.index.table]
        if self._obs is not None:
            arrays += list(self._obs.values())
        if self._protected is not None:
            arrays += [*self._protected.obs.values(), *self._protected[1:]]
        return int(sum(array.nbytes for array in arrays if array is not None))

    # ------------------------------------------------------------------ adding

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
        step = self.layout.validate(obs, next_obs, action, reward, done, infos)
        if self._obs is None:
            self._allocate()
        store = self.store()
        envs = np.arange(self.n_envs)
        self._close_broken_streams(step.obs)
        rows, time = self.index.step(step.done)
        here, after = rows % self.buffer_size, (rows + 1) % self.buffer_size
        for key, array in store.obs.items():
            array[here, envs] = step.obs[key]
            array[after, envs] = step.next_obs[key]
        store.actions[here, envs] = step.action
        store.rewards[here, envs] = step.reward
        store.dones[here, envs] = step.done
        store.timeouts[here, envs] = step.timeout
        store.time_steps[here, envs] = time
        store.actions[after, envs] = 0
        store.rewards[after, envs] = 0.0
        store.dones[after, envs] = False
        store.timeouts[after, envs] = False
        store.time_steps[after, envs] = time + 1
        self.pos = self.index.pos()  # type: ignore[assignment]  # per column, see reset
        self.full = self.index.full()  # type: ignore[assignment]

    def add_rollouts(self, rollouts: Sequence[Rollout], protected: bool = False, names: Sequence[str] | None = None) -> None:
        """Store whole finished rollouts (a dataset's episodes), each as a rollout of its own.

        Every rollout is validated first (:meth:`~sb3_amago.validation.StepLayout.validate_rollout`:
        shapes, values in the spaces, finite, an end that is a termination or a time limit) and the
        replay is checked to hold them all; only then is anything stored, so on error the replay is
        unchanged. Into the rings, the rollouts are spread over the env columns (each column's
        running rollout ends there, unfinished); ``protected``, they go to the protected store.

        :param rollouts: ``T + 1`` observations key by key (:data:`~sb3_amago.keys.OBS_KEY` for a
            non-Dict space), ``T`` actions in the buffer representation and ``T`` rewards each
        :param protected: keep them out of eviction
        :param names: what error messages call each rollout (default ``rollout <i>``)
        :raises ValueError: naming the rollout and the problem, or the capacity it exceeds
        """
        labels = list(names) if names is not None else [f"rollout {i}" for i in range(len(rollouts))]
        checked = []
        for label, rollout in zip(labels, rollouts, strict=True):
            try:
                checked.append(self.layout.validate_rollout(rollout))
            except ValueError as exc:
                raise ValueError(f"{label}: {str(exc).rstrip('.')}. Nothing was stored.") from None
        n_obs = np.array([rollout.length + 1 for rollout in checked], dtype=np.int64)
        if protected:
            held = self.index.protected_rows()
            if held + n_obs.sum() > self.buffer_size * self.n_envs:
                raise ValueError(
                    f"The {len(checked)} rollouts take {n_obs.sum()} rows (one per observation, the final one included), "
                    f"and the protected rollouts already stored {held}: more than the replay holds "
                    f"(buffer_size={self.buffer_size * self.n_envs}). Raise buffer_size or store fewer. Nothing was stored."
                )
        else:
            columns = self._columns_for(n_obs)
        if not checked:
            return
        if self._obs is None:
            self._allocate()
        if protected:
            self._store_protected(checked, n_obs)
        else:
            self.end_running_rollouts()
            store = self.store()
            for rollout, col in zip(checked, columns):
                start = self.index.append(int(col), rollout.length + 1)
                store_rollout(store, self.buffer_size, int(col), start, rollout)
            self.pos = self.index.pos()  # type: ignore[assignment]  # per column, see reset
            self.full = self.index.full()  # type: ignore[assignment]

    def _columns_for(self, n_obs: np.ndarray) -> np.ndarray:
        """The env column of each rollout of ``n_obs`` observations: each to the column given the fewest
        rows so far; a ValueError unless every column's rollouts fit in it (none evicts another)."""
        given = np.zeros(self.n_envs, dtype=np.int64)
        columns = np.zeros(len(n_obs), dtype=np.int64)
        for i, n in enumerate(n_obs):
            columns[i] = int(np.argmin(given))
            given[columns[i]] += n
        if len(n_obs) and given.max() > self.buffer_size:
            longest = int(n_obs.max())
            raise ValueError(
                f"The {len(n_obs)} rollouts take {n_obs.sum()} rows (one per observation, the final one included; "
                f"the longest {longest}), more than the replay holds without evicting some of them "
                f"(buffer_size={self.buffer_size * self.n_envs}: {self.n_envs} env columns of {self.buffer_size} rows). "
                "Raise buffer_size or store fewer. Nothing was stored."
            )
        return columns

    def _store_protected(self, rollouts: list[Rollout], n_obs: np.ndarray) -> None:
        """Append ``rollouts`` to the protected store (grown to hold them) and record them in the index."""
        held, rows = self.index.protected_rows(), self.index.protected_rows() + int(n_obs.sum())
        ring, old = self.store(), self._protected

        def grown(like: np.ndarray, before: np.ndarray | None) -> np.ndarray:
            array = np.zeros((rows, 1, *like.shape[2:]), dtype=like.dtype)
            if before is not None:
                array[:held] = before
            return array

        before: list[np.ndarray | None] = [None] * (len(ring) - 1) if old is None else list(old[1:])
        store = ReplayStore(
            {key: grown(like, None if old is None else old.obs[key]) for key, like in ring.obs.items()},
            *(grown(like, previous) for like, previous in zip(ring[1:], before)),
        )
        for rollout in rollouts:
            store_rollout(store, rows, 0, self.index.add_protected(rollout.length + 1), rollout)
        self._protected = store

    def rollouts(self) -> list[Rollout]:
        """Copies of every whole finished rollout the replay holds, the protected ones first (running
        rollouts and rollouts that lost their beginning to eviction are left out)."""
        keys = self.obs_keys
        out = []
        for protected, spans in ((True, self.index.protected_spans()), (False, self.index.spans())):
            if len(spans.cols) == 0:
                continue
            store, rows = self.store_of(protected)
            for col, row, first, n in zip(spans.cols, spans.first_rows, spans.first, spans.n_obs):
                rollout = read_rollout(store, rows, int(col), int(row), int(n), keys)
                if first == 0 and rollout.start_time == 0 and (rollout.terminated or rollout.truncated):
                    out.append(rollout)
        return out

    def end_running_rollouts(self) -> None:
        """End every env's running rollout where it stands, unfinished (the envs are restarting):
        each env's next step starts a new rollout."""
        self.index.end_rollouts(slice(None))

    def _close_broken_streams(self, obs: dict[str, np.ndarray]) -> None:
        """Close running rollouts whose newest observation is not the ``obs`` now given."""
        running, heads = self.index.running_heads()
        if len(running) == 0:
            return
        store = self.store()
        here = heads % self.buffer_size
        same = np.ones(len(running), dtype=bool)
        for key, array in store.obs.items():
            stored = array[here, running]
            given = obs[key][running].astype(stored.dtype)
            same &= (stored == given).reshape(len(running), -1).all(axis=1)
        self.index.end_rollouts(running[~same])

    def size(self) -> int:
        """Number of transitions that can be sampled."""
        return self.index.size()

    def num_rollouts(self) -> int:
        """Number of rollouts that can be sampled, running ones included."""
        return self.index.num_rollouts()

    def draw_windows(self, n_obs: np.ndarray, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Draw window offsets ``(B,)`` and lengths ``(B,)`` in rollouts of ``n_obs`` observations.

        A rollout that fits in one window (``max_seq_len + 1`` observations) is taken whole. In a
        longer one the window starts at any of its transitions, and is cut short where the rollout
        ends: each of its transitions is in ``max_seq_len`` of the possible windows (its first
        ``max_seq_len - 1`` in fewer), its last ones included. Full-length windows only would put
        the last transition, where a rollout terminates, in one window of ``n - max_seq_len + 1``.
        """
        available = n_obs - first
        whole = available <= self.max_seq_len + 1
        offset = np.random.randint(0, np.where(whole, 1, available - 1))  # 0 for a whole rollout
        return first + offset, np.minimum(self.max_seq_len + 1, available - offset)

    def gather(
        self, cols: np.ndarray, starts: np.ndarray, length: np.ndarray, keys: list[str], protected: bool = False
    ) -> Windows:
        """Windows of ``length`` ``(B,)`` observations from absolute rows ``starts`` ``(B,)`` of columns
        ``cols`` (of the protected store if ``protected``).

        One gather per array over a ``(B, L + 2)`` grid of rows: the row before each window (for the
        previous action, reward and end flags) and the window, padding repeating its last row.
        """
        store, ring_rows = self.store_of(protected)
        steps = np.arange(-1, int(length.max()))
        rows = (starts[:, None] + np.minimum(steps, length[:, None] - 1)) % ring_rows
        col = cols[:, None]
        time_idx = store.time_steps[rows[:, 1:], col].astype(np.int64)
        started = time_idx > 0
        actions = store.actions[rows, col].astype(np.float32)
        before = rows[:, :-1]
        done = store.dones[before, col] & started
        timeout = store.timeouts[before, col]
        return Windows(
            observations={key: store.obs[key][rows[:, 1:], col] for key in keys},
            actions=actions[:, 1:],
            prev_actions=actions[:, :-1] * started[..., None],
            rewards=store.rewards[before, col] * started,
            terminated=(done & ~timeout).astype(np.float32),
            truncated=(done & timeout).astype(np.float32),
            time_idx=time_idx,
            real=steps[None, 1:] < length[:, None],
        )

    # Windows of whole rollouts, not SB3's batches of single transitions.
    def sample(self, batch_size: int, env: VecNormalize | None = None) -> TrajectoryBatch:  # type: ignore[override]
        """Draw ``batch_size`` windows (see the class docstring for the alignment).

        :param batch_size: ``B``
        :param env: a VecNormalize to normalise observations and rewards with, as SB3 does
        :return: tensors on the buffer's device, padded to the longest window in the batch
        """
        spans, protected = self.index.spans(), self.index.protected_spans()
        if len(spans.cols) + len(protected.cols) == 0:
            raise ValueError("The replay buffer holds no rollout yet: add steps before sampling.")
        if len(protected.cols) == 0:
            windows = self._windows(spans.take(self._pick(spans, batch_size)), protected=False)
        else:
            ring_picked, protected_picked = self._pick_with_protected(spans, protected, batch_size)
            parts = [
                self._windows(part.take(picked), protected=kind)
                for part, picked, kind in ((spans, ring_picked, False), (protected, protected_picked, True))
                if len(picked)
            ]
            windows = concatenated(parts)
        return self._to_batch(windows, env)

    def _windows(self, spans: Spans, protected: bool) -> Windows:
        """One window of each rollout of ``spans`` (of the protected store if ``protected``), relabeled if the replay relabels."""
        if self.relabeler is None:
            offsets, length = self.draw_windows(spans.n_obs, spans.first)
            keys = [key for key in self.obs_keys if key not in self.hidden_keys]
            return self.gather(spans.cols, spans.first_rows + offsets, length, keys, protected)
        return relabeled_windows(self, self.relabeler, spans, protected)

    def _pick_with_protected(self, spans: Spans, protected: Spans, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """Indices of the drawn rollouts among ``spans`` and among the ``protected`` ones: ``protected_share``
        of the batch from the protected ones (while there are others), else all rollouts alike."""
        if self.protected_share is not None and len(spans.cols):
            n_protected = round(self.protected_share * batch_size)
            return self._pick(spans, batch_size - n_protected), self._pick(protected, n_protected)
        both = Spans(*(np.concatenate(pair) for pair in zip(spans, protected)))
        picked = self._pick(both, batch_size)
        n_ring = len(spans.cols)
        return picked[picked < n_ring], picked[picked >= n_ring] - n_ring

    def _pick(self, spans: Spans, batch_size: int) -> np.ndarray:
        """``(batch_size,)`` indices of the drawn rollouts: uniformly, or in proportion to their length."""
        if self.sample_by_length:
            cumulative = np.cumsum(spans.n_obs - spans.first)
            return np.searchsorted(cumulative, np.random.random(batch_size) * cumulative[-1], side="right")
        return np.random.randint(0, len(spans.cols), size=batch_size)

    def _to_batch(self, windows: Windows, env: VecNormalize | None) -> TrajectoryBatch:
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


def store_rollout(store: ReplayStore, ring_rows: int, col: int, start: int, rollout: Rollout) -> None:
    """Write a validated finished ``rollout`` into column ``col`` of ``store`` from absolute row ``start``
    (rings of ``ring_rows`` rows), as ``add`` would have stored its steps one by one."""
    n = rollout.length
    rows = (start + np.arange(n + 1)) % ring_rows
    for key, array in store.obs.items():
        array[rows, col] = rollout.observations[key]
    store.actions[rows[:-1], col] = rollout.actions
    store.rewards[rows[:-1], col] = rollout.rewards
    store.dones[rows[:-1], col] = np.arange(n) == n - 1
    store.timeouts[rows[:-1], col] = (np.arange(n) == n - 1) & rollout.truncated
    for array in (store.actions, store.rewards, store.dones, store.timeouts):
        array[rows[-1], col] = 0
    store.time_steps[rows, col] = np.arange(n + 1)


def concatenated(parts: list[Windows]) -> Windows:
    """The windows of ``parts`` as one batch, in order, padded on the right to the widest."""
    width = max(part.real.shape[1] for part in parts)

    def padded(array: np.ndarray) -> np.ndarray:
        pad = [(0, 0), (0, width - array.shape[1])] + [(0, 0)] * (array.ndim - 2)
        return np.pad(array, pad)

    def joined(field: str) -> np.ndarray:
        return np.concatenate([padded(getattr(part, field)) for part in parts])

    keys = parts[0].observations
    return Windows(
        observations={key: np.concatenate([padded(part.observations[key]) for part in parts]) for key in keys},
        **{
            field: joined(field)
            for field in ("actions", "prev_actions", "rewards", "terminated", "truncated", "time_idx", "real")
        },
    )


def step_layout(
    observation_space: spaces.Space, action_space: spaces.Space, action_dim: int, n_envs: int, handle_timeouts: bool
) -> StepLayout:
    """The layout of one step of ``n_envs`` envs in a replay of ``observation_space`` (flat) and ``action_space``."""
    obs_spaces = dict(observation_space.spaces) if isinstance(observation_space, spaces.Dict) else {OBS_KEY: observation_space}
    shapes = get_obs_shape(observation_space)
    obs_shapes = shapes if isinstance(shapes, dict) else {OBS_KEY: shapes}
    return StepLayout(observation_space, obs_spaces, obs_shapes, action_space, action_dim, n_envs, handle_timeouts)


def upgraded_from_version_1(state: dict[str, Any]) -> dict[str, Any]:
    """A version-1 replay's pickled attributes in the version-2 layout (the same rollouts and data)."""
    state = dict(state)
    index = RolloutIndex(state["n_envs"], state["buffer_size"])
    index.head, index.time, index.running = state.pop("_head"), state.pop("_time"), state.pop("_running")
    index.table, index.n_table = state.pop("_table"), state.pop("_n_table")
    state["index"] = index
    del state["_obs_spaces"], state["_obs_shapes"]
    state["layout"] = step_layout(
        state["observation_space"],
        state["action_space"],
        state["action_dim"],
        state["n_envs"],
        state["handle_timeout_termination"],
    )
    state["format_version"] = 2
    return state
