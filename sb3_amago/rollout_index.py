"""Where the rollouts lie in the replay's rings: the replay's bookkeeping, in numpy, apart from the
data it stores.

The replay keeps one ring of ``rows`` rows per env column. Rows are counted absolutely (every row
ever written to a column, so row ``r`` sits at ring position ``r % rows``); a column's oldest
intact row is ``head - rows + 1``. A rollout is a run of consecutive rows of one column, from its
first row to its end (exclusive): one row per observation, the newest included.

Protected rollouts (stored from datasets with ``protected=True``) lie apart from the rings, in a
store of their own that only grows: rows ``first .. end - 1`` of it, never evicted.
"""

from typing import NamedTuple

import numpy as np


class Spans(NamedTuple):
    """Sampleable rollouts, each field ``(R,)``.

    :param cols: env column of each rollout
    :param first_rows: absolute row of its first intact observation
    :param first: its first window offset: 1 for a rollout that lost its beginning (its first intact
        row only gives the previous action and reward), else 0
    :param n_obs: its number of intact observations
    """

    cols: np.ndarray
    first_rows: np.ndarray
    first: np.ndarray
    n_obs: np.ndarray

    def take(self, picked: np.ndarray) -> "Spans":
        """The rollouts at the indices ``picked``, in that order."""
        return Spans(*(field[picked] for field in self))


class RolloutIndex:
    """The rollout table and each column's newest row, time index and running rollout.

    Eviction: a rollout that loses its first row to newer rows is dropped, unless it is longer than
    its column (it outgrew the ring while running): it then stays while at least two of its rows
    are intact, keeping its newest observations.

    :param n_envs: number of env columns
    :param rows: rows per column
    """

    def __init__(self, n_envs: int, rows: int) -> None:
        self.rows = rows
        #: Per column: the absolute index of its newest row (-1 before any).
        self.head = np.full(n_envs, -1, dtype=np.int64)
        #: Per column: the time index, within its rollout, of the observation at ``head``.
        self.time = np.zeros(n_envs, dtype=np.int64)
        #: Per column: the table entry of its running rollout (-1 for none).
        self.running = np.full(n_envs, -1, dtype=np.int64)
        #: Rollout table ``(capacity, 3)``: column, absolute first row, absolute end row (exclusive);
        #: the first ``n_table`` entries are in use.
        self.table = np.zeros((0, 3), dtype=np.int64)
        self.n_table = 0
        #: Protected rollouts ``(n, 2)``: first row and end row (exclusive) in the protected store.
        self.protected = np.zeros((0, 2), dtype=np.int64)

    def __setstate__(self, state: dict) -> None:
        """Unpickle; an index pickled before protected rollouts existed has none."""
        state.setdefault("protected", np.zeros((0, 2), dtype=np.int64))
        self.__dict__.update(state)

    def step(self, done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Record one step of every env: columns without a running rollout start one, every column
        takes two rows (the observation acted on, and the next one, which the following step
        overwrites with its own data), and the rollouts where ``done`` ``(n_envs,)`` is True end.

        :return: the absolute row of each column's observation acted on, and its time index, ``(n_envs,)``
        """
        starting = self.running < 0
        rows = np.where(starting, self.head + 1, self.head)
        self.time[starting] = 0
        for env in np.flatnonzero(starting):
            self.running[env] = self._new_rollout(int(env), int(rows[env]))
        time = self.time.copy()
        self.head = rows + 1
        self.time += 1
        self.table[self.running, 2] = self.head + 1
        self.running[done] = -1
        return rows, time

    def running_heads(self) -> tuple[np.ndarray, np.ndarray]:
        """The columns with a running rollout and the absolute row of their newest observation."""
        envs = np.flatnonzero(self.running >= 0)
        return envs, self.head[envs]

    def end_rollouts(self, envs: np.ndarray | slice) -> None:
        """End the running rollouts of the columns ``envs`` where they stand (their next step starts a new one)."""
        self.running[envs] = -1

    def append(self, env: int, n_obs: int) -> int:
        """Record a whole finished rollout of ``n_obs`` observations written after column ``env``'s
        newest row (its running rollout ends first); return the absolute row of its first observation."""
        if n_obs > self.rows:
            raise ValueError(f"A rollout of {n_obs} observations does not fit a column of {self.rows} rows")
        self.running[env] = -1
        start = int(self.head[env]) + 1
        entry = self._new_rollout(env, start)  # may grow the table
        self.table[entry, 2] = start + n_obs
        self.head[env] = start + n_obs - 1
        self.time[env] = n_obs - 1
        return start

    def add_protected(self, n_obs: int) -> int:
        """Record a protected rollout of ``n_obs`` observations at the end of the protected store;
        return the row of its first observation there."""
        start = self.protected_rows()
        self.protected = np.concatenate([self.protected, np.array([[start, start + n_obs]], dtype=np.int64)])
        return start

    def protected_rows(self) -> int:
        """Rows the protected rollouts take."""
        return int(self.protected[-1, 1]) if len(self.protected) else 0

    def protected_spans(self) -> Spans:
        """The protected rollouts, in the order they were added (column 0 of the protected store)."""
        first, end = self.protected[:, 0], self.protected[:, 1]
        zeros = np.zeros(len(first), dtype=np.int64)
        return Spans(zeros, first.copy(), zeros.copy(), end - first)

    def pos(self) -> np.ndarray:
        """``(n_envs,)`` the ring position each column writes next (SB3's ``pos``, per column)."""
        return (self.head + 1) % self.rows

    def full(self) -> np.ndarray:
        """``(n_envs,)`` whether each column's ring has wrapped (SB3's ``full``, per column)."""
        return self.head + 1 >= self.rows

    def _new_rollout(self, env: int, start: int) -> int:
        """Append a rollout of column ``env`` starting at absolute row ``start``; return its table index."""
        if self.n_table == len(self.table):
            self._compact()
        if self.n_table == len(self.table):
            grown = np.zeros((max(64, 2 * len(self.table)), 3), dtype=np.int64)
            grown[: self.n_table] = self.table[: self.n_table]
            self.table = grown
        index = self.n_table
        self.table[index] = (env, start, start + 1)
        self.n_table += 1
        return index

    def live(self) -> np.ndarray:
        """``(n_table,)`` bool, the table entries whose rollout can still be sampled."""
        col, start, end = self.table[: self.n_table].T
        oldest = self.head[col] - self.rows + 1
        return (start >= oldest) | ((end - start > self.rows) & (end - oldest >= 2))

    def _compact(self) -> None:
        """Drop the table entries of evicted rollouts."""
        keep = np.flatnonzero(self.live())
        new_index = np.full(self.n_table, -1, dtype=np.int64)
        new_index[keep] = np.arange(len(keep))
        self.table[: len(keep)] = self.table[keep]
        self.n_table = len(keep)
        running = self.running >= 0
        self.running[running] = new_index[self.running[running]]

    def spans(self) -> Spans:
        """The rollouts that can be sampled, running ones included, in table order."""
        table = self.table[: self.n_table][self.live()]
        col, start, end = table[:, 0], table[:, 1], table[:, 2]
        oldest = self.head[col] - self.rows + 1
        lost_start = start < oldest
        first_row = np.where(lost_start, oldest, start)
        return Spans(col, first_row, lost_start.astype(np.int64), end - first_row)

    def size(self) -> int:
        """Number of transitions that can be sampled, the protected ones included."""
        spans = self.spans()
        protected = self.protected[:, 1] - self.protected[:, 0] - 1
        return int(np.sum(spans.n_obs - spans.first - 1) + np.sum(protected))

    def num_rollouts(self) -> int:
        """Number of rollouts that can be sampled, running and protected ones included."""
        return int(np.count_nonzero(self.live())) + len(self.protected)
