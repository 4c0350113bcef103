"""The benchmarks' shared library (benchmarks/curves.py): recording a run, the CSV store, thresholds, tables."""

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import curves

FIELDS = {"run": str, "env_steps": int, "wall_s": float, "score": float, "final": int}


def rows_of(run: str, scores: list[float], finished: bool = True) -> list[curves.Row]:
    """Rows of one run at steps 0, 100, 200, ... with 10 training seconds per 100 steps."""
    return [
        {"run": run, "env_steps": 100 * i, "wall_s": 10.0 * i, "score": score, "final": int(finished and i == len(scores) - 1)}
        for i, score in enumerate(scores)
    ]


class FakeModel:
    """What EvalRecorder reads of a model."""

    num_timesteps = 0


def recorded(
    steps: list[int], budget: int, eval_freq: int = 100, at_start: bool = True, stop=None
) -> tuple[list[curves.Row], int]:
    """The rows an EvalRecorder hands over while a run goes through ``steps`` (env step counts), and
    how many steps ran (the recorder may stop the run)."""
    rows: list[curves.Row] = []
    recorder = curves.EvalRecorder(
        lambda: {"score": len(rows) / 10}, eval_freq, budget, {"run": "a"}, rows.append, at_start=at_start, stop=stop
    )
    model = FakeModel()
    recorder.init_callback(model)  # type: ignore[arg-type]
    recorder.on_training_start({}, {})
    ran = 0
    for step in steps:
        model.num_timesteps = step
        ran += 1
        if not recorder.on_step():
            break
    recorder.on_training_end()
    return rows, ran


def test_recorder_evaluates_at_start_every_eval_freq_and_at_the_end() -> None:
    rows, _ = recorded(list(range(8, 321, 8)), budget=320)
    assert [(row["env_steps"], row["final"]) for row in rows] == [(0, 0), (104, 0), (200, 0), (304, 0), (320, 1)]
    assert all(row["run"] == "a" and row["wall_s"] >= 0.0 for row in rows)


def test_recorder_stop_rule_makes_its_row_final() -> None:
    stop = curves.consecutive_hits("score", 0.2, 2)
    rows, ran = recorded(list(range(8, 1001, 8)), budget=1000, at_start=False, stop=stop)
    # Scores 0.0, 0.1, 0.2, 0.3: the fourth evaluation is the second in a row at >= 0.2.
    assert [(row["env_steps"], row["score"], row["final"]) for row in rows] == [
        (104, 0.0, 0),
        (200, 0.1, 0),
        (304, 0.2, 0),
        (400, 0.3, 1),
    ]
    assert ran == 400 // 8, "the run stops at the final row"


def test_store_appends_reads_typed_and_upgrades_older_headers(tmp_path: Path) -> None:
    path = tmp_path / "curves.csv"
    store = curves.CurveStore(path, {**FIELDS, "commit": str}, defaults={"commit": ""})
    path.write_text("run,env_steps,wall_s,score,final\nold,0,0.0,0.5,1\n")
    (row,) = rows_of("new", [0.25])
    store.append({**row, "commit": "abc"})
    store.append({**row, "commit": "def"})
    assert store.read() == [
        {"run": "old", "env_steps": 0, "wall_s": 0.0, "score": 0.5, "final": 1, "commit": ""},
        {**row, "commit": "abc"},
        {**row, "commit": "def"},
    ]
    assert path.read_text().count("run,env_steps") == 1
    assert path.read_text().splitlines()[0] == "run,env_steps,wall_s,score,final,commit"


def test_store_drops_only_the_unfinished_runs_it_is_told_of(tmp_path: Path) -> None:
    store = curves.CurveStore(tmp_path / "curves.csv", FIELDS)
    done, mine, theirs = rows_of("done", [0.1, 0.2]), rows_of("mine", [0.1], False), rows_of("theirs", [0.3], False)
    store.write(done + mine + theirs)
    assert store.drop_unfinished(lambda row: row["run"], only=["done", "mine"]) == {"done"}
    assert store.read() == done + theirs
    assert store.finished(lambda row: row["run"]) == {"done"}


def test_first_crossing_and_first_reach() -> None:
    assert curves.first_crossing([0.1, 0.89, 0.95, 0.5, 1.0], 0.9) == 2
    assert curves.first_crossing([0.1, 0.2], 0.9) is None
    rows = rows_of("a", [0.1, 0.89, 0.95, 0.5, 1.0])
    assert curves.first_reach(rows[::-1], 0.96, column="score")["env_steps"] == 400, "rows are taken in env-step order"
    curve = curves.run_curve(rows)
    assert curve.crossing(0.9) == (200, 20.0)
    assert curve.crossing(1.01) is None


def test_mean_curve_uses_the_steps_all_seeds_share() -> None:
    short = curves.run_curve(rows_of("a", [0.2, 0.8]))
    long = curves.run_curve(rows_of("b", [0.4, 1.0, 1.0]))
    mean = curves.mean_curve([short, long])
    np.testing.assert_array_equal(mean.steps, [0, 100])
    np.testing.assert_allclose(mean.score, [0.3, 0.9])
    np.testing.assert_allclose(mean.score_std, [0.1, 0.1])
    assert mean.crossing(0.9) == (100, 10.0)


def test_tables_reports_and_plots(tmp_path: Path) -> None:
    table = curves.markdown_table(("a", "b"), [(1, curves.per_seed([2, 3]))]).splitlines()
    assert table == ["| a | b |", "|---|---|", "| 1 | 2 / 3 |"]
    curves.write_report(tmp_path, "r", {"x": 1}, ["# r", "", table[0]])
    assert (tmp_path / "r.json").read_text() == '{\n  "x": 1\n}\n'
    assert (tmp_path / "r.md").read_text() == "# r\n\n| a | b |\n"
    pytest.importorskip("matplotlib")
    curves.plot_curves(tmp_path / "p.png", [("a", curves.run_curve(rows_of("a", [0.2, 0.8])))], "t", "score", 0.9)
    assert (tmp_path / "p.png").stat().st_size > 0
