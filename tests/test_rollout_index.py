"""The replay's rollout bookkeeping alone (no observation data): rows, time indices, ends, eviction."""

import numpy as np

from sb3_amago.rollout_index import RolloutIndex, Spans


def run(index: RolloutIndex, dones: list[list[bool]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Feed one step per entry of ``dones`` (one flag per env); return what each step returned."""
    return [index.step(np.array(done)) for done in dones]


def spans_of(index: RolloutIndex) -> list[tuple[int, int, int, int]]:
    """(column, first row, first offset, observations) of each sampleable rollout, sorted."""
    return sorted(zip(*(field.tolist() for field in index.spans())))


def test_steps_take_two_rows_and_ends_start_a_new_rollout_after_the_final_observation() -> None:
    index = RolloutIndex(n_envs=2, rows=100)
    (rows0, time0), (rows1, time1), (rows2, time2) = run(index, [[False, False], [True, False], [False, False]])
    assert rows0.tolist() == [0, 0] and time0.tolist() == [0, 0]
    assert rows1.tolist() == [1, 1] and time1.tolist() == [1, 1]
    # Env 0 finished: its final observation is row 2, its next rollout starts at row 3.
    assert rows2.tolist() == [3, 2] and time2.tolist() == [0, 2]
    assert spans_of(index) == [(0, 0, 0, 3), (0, 3, 0, 2), (1, 0, 0, 4)]
    assert index.size() == 2 + 1 + 3 and index.num_rollouts() == 3
    assert index.pos().tolist() == [5, 4] and index.full().tolist() == [False, False]


def test_ending_a_running_rollout_starts_the_next_step_afresh() -> None:
    index = RolloutIndex(n_envs=1, rows=50)
    run(index, [[False]] * 3)
    envs, heads = index.running_heads()
    assert envs.tolist() == [0] and heads.tolist() == [3]
    index.end_rollouts(envs)
    assert index.running_heads()[0].size == 0
    ((rows, time),) = run(index, [[False]])
    assert rows.tolist() == [4] and time.tolist() == [0]
    assert spans_of(index) == [(0, 0, 0, 4), (0, 4, 0, 2)]


def test_a_rollout_that_loses_its_first_row_is_dropped_whole() -> None:
    index = RolloutIndex(n_envs=1, rows=8)
    run(index, [[False], [True]])  # rows 0-2
    run(index, [[False], [False], [True]])  # rows 3-6
    assert spans_of(index) == [(0, 0, 0, 3), (0, 3, 0, 4)]
    run(index, [[False]])  # rows 7-8: row 8 overwrites row 0
    assert spans_of(index) == [(0, 3, 0, 4), (0, 7, 0, 2)]


def test_a_rollout_longer_than_its_column_keeps_its_newest_observations() -> None:
    index = RolloutIndex(n_envs=1, rows=6)
    run(index, [[False]] * 10)  # one running rollout of 11 observations in a ring of 6 rows
    # The oldest intact row (5) only gives the previous action and reward: windows start one later.
    assert spans_of(index) == [(0, 5, 1, 6)]
    assert index.size() == 4
    assert index.full().tolist() == [True] and index.pos().tolist() == [11 % 6]
    # It ends; the next rollout overwrites it row by row, and it stays while two of its rows are intact.
    run(index, [[True], [False], [False]])
    assert spans_of(index) == [(0, 9, 1, 3), (0, 12, 0, 3)]
    run(index, [[False]])
    assert spans_of(index) == [(0, 10, 1, 2), (0, 12, 0, 4)]
    run(index, [[False]])
    assert spans_of(index) == [(0, 12, 0, 5)]


def test_the_table_is_compacted_as_rollouts_are_evicted() -> None:
    index = RolloutIndex(n_envs=2, rows=20)
    for _ in range(200):  # env 0: rollouts of one transition, env 1: one rollout running throughout
        run(index, [[True, False]])
    assert len(index.table) == 64, "evicted entries are dropped instead of growing the table"
    assert index.num_rollouts() == 10 + 1
    spans = index.spans()
    assert isinstance(spans, Spans) and sorted(set(spans.cols.tolist())) == [0, 1]
    running = index.table[index.running[1]]
    assert running.tolist() == [1, 0, 201], "the running rollout's entry survives compaction"


def test_spans_take_keeps_the_fields_together() -> None:
    spans = Spans(np.array([0, 1, 2]), np.array([10, 11, 12]), np.array([0, 1, 0]), np.array([5, 6, 7]))
    taken = spans.take(np.array([2, 0, 2]))
    assert [field.tolist() for field in taken] == [[2, 0, 2], [12, 10, 12], [0, 0, 0], [7, 5, 7]]


def test_appended_rollouts_follow_the_newest_row_and_are_evicted_like_collected_ones() -> None:
    index = RolloutIndex(n_envs=2, rows=10)
    run(index, [[False, False]] * 2)  # running rollouts of 3 observations, rows 0-2
    start = index.append(0, 4)  # a whole finished rollout of 4 observations: rows 3-6 of column 0
    assert start == 3 and index.running.tolist()[0] == -1, "the running rollout of that column ends"
    assert spans_of(index) == [(0, 0, 0, 3), (0, 3, 0, 4), (1, 0, 0, 3)]
    ((rows, time),) = [index.step(np.array([False, False]))]
    assert rows.tolist() == [7, 2] and time.tolist() == [0, 2], "the next step starts a rollout after it"
    assert index.append(0, 3) == 9  # rows 9-11: rows 10 and 11 overwrite rows 0 and 1
    assert spans_of(index) == [(0, 3, 0, 4), (0, 7, 0, 2), (0, 9, 0, 3), (1, 0, 0, 4)]
    try:
        index.append(1, 11)
    except ValueError as exc:
        assert "does not fit" in str(exc)
    else:
        raise AssertionError("a rollout longer than a column must be refused")


def test_protected_rollouts_are_kept_apart_and_never_evicted() -> None:
    index = RolloutIndex(n_envs=1, rows=4)
    assert index.add_protected(3) == 0 and index.add_protected(5) == 3
    assert index.protected_rows() == 8
    run(index, [[False]] * 20)  # the ring wraps many times
    protected = index.protected_spans()
    assert protected.first_rows.tolist() == [0, 3] and protected.n_obs.tolist() == [3, 5]
    assert protected.cols.tolist() == [0, 0] and protected.first.tolist() == [0, 0]
    assert index.num_rollouts() == 1 + 2 and index.size() == 2 + (2 + 4)
