"""The pure parts of benchmarks/learning.py: resuming, its CSV columns, the report. No training."""

import dataclasses
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import learning


def make_rows(task: str, algo: str, seed: int, budget: int, scores: list[float], finished: bool = True) -> list[learning.Row]:
    """Evaluation rows of one run at steps 0, 100, 200, ... with 10 training seconds per 100 steps."""
    return [
        {
            "task": task,
            "algo": algo,
            "seed": seed,
            "budget": budget,
            "env_steps": 100 * i,
            "wall_s": 10.0 * i,
            "mean_return": 2 * score - 1,
            "std_return": 0.0,
            "score": score,
            "trial_returns": "",
            "final": int(finished and i == len(scores) - 1),
            "commit": "abc1234",
        }
        for i, score in enumerate(scores)
    ]


def quick_config(tmp_path: Path, *extra: str) -> learning.Config:
    return learning.parse_config(["--quick", "--out-dir", str(tmp_path), *extra])


def test_resume_skips_finished_runs_and_drops_interrupted_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = quick_config(tmp_path, "--tasks", "RepeatFirstEasy", "--algos", "amago", "ppo_lstm", "--budget", "300")
    done = make_rows("RepeatFirstEasy", "amago", 0, 300, [0.2, 0.5])
    interrupted = make_rows("RepeatFirstEasy", "amago", 1, 300, [0.1], finished=False)
    other_budget = make_rows("RepeatFirstEasy", "ppo_lstm", 0, 999, [0.3, 0.4])
    config.store.write(done + interrupted + other_budget)
    trained: list[learning.RunKey] = []
    monkeypatch.setattr(learning, "train_run", lambda key, _config: trained.append(key))

    learning.run_all(config)

    assert trained == [
        learning.RunKey("RepeatFirstEasy", "amago", 1, 300),
        learning.RunKey("RepeatFirstEasy", "ppo_lstm", 0, 300),
        learning.RunKey("RepeatFirstEasy", "ppo_lstm", 1, 300),
    ]
    assert config.store.read() == done + other_budget  # the interrupted run's row is gone


def test_an_interrupted_run_with_a_checkpoint_keeps_its_rows_up_to_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = quick_config(tmp_path, "--tasks", "RepeatFirstEasy", "--algos", "amago", "--budget", "300")
    config = dataclasses.replace(config, checkpoint_dir=tmp_path / "ckpt", seeds=(0, 1))
    saved = make_rows("RepeatFirstEasy", "amago", 0, 300, [0.1, 0.2, 0.3], finished=False)
    unsaved = make_rows("RepeatFirstEasy", "amago", 1, 300, [0.1, 0.2], finished=False)
    config.store.write(saved + unsaved)
    key = learning.RunKey("RepeatFirstEasy", "amago", 0, 300)
    meta = learning.RunCheckpoint(config.checkpoint_dir, key).dir / "meta.json"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"env_steps": 100, "wall_s": 10.0}))  # saved at the second row
    monkeypatch.setattr(learning, "train_run", lambda _key, _config: None)

    learning.run_all(config)

    assert config.store.read() == saved[:2]  # the rows after the checkpoint and the unsaved run's rows are gone


def test_a_run_cut_short_continues_from_its_checkpoint(tmp_path: Path) -> None:
    """Interrupted after its third evaluation, the run continues from the checkpoint saved there: one
    row per evaluation step, training seconds that keep growing, one final row, checkpoint removed."""
    argv = ["--tasks", "RepeatFirstEasy", "--algos", "amago", "--seeds", "0", "--budget", "240", "--evals", "4"]
    config = learning.parse_config(
        ["--quick", "--out-dir", str(tmp_path), "--eval-episodes", "1", "--checkpoint-dir", str(tmp_path / "ckpt"), *argv]
    )
    append, calls = learning.CurveStore.append, []

    def append_then_stop(store: learning.CurveStore, row: learning.Row) -> None:
        append(store, row)
        calls.append(row["env_steps"])
        if len(calls) == 3:
            raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(learning.CurveStore, "append", append_then_stop)
        with pytest.raises(KeyboardInterrupt):
            learning.run_all(config)
    key = learning.RunKey("RepeatFirstEasy", "amago", 0, 240)
    checkpoint = learning.RunCheckpoint(config.checkpoint_dir, key)
    assert checkpoint.saved_at() is not None and checkpoint.saved_at()[0] == calls[1]  # saved after the second row
    assert (checkpoint.dir / "envs.pkl").exists()  # the POPGym envs pickle: the run goes on from their state

    learning.run_all(config)

    rows = config.store.read()
    steps = [row["env_steps"] for row in rows]
    assert steps == sorted(set(steps)) and steps[0] == 0 and steps[-1] >= 240
    assert [row["final"] for row in rows] == [0] * (len(rows) - 1) + [1]
    assert all(a["wall_s"] <= b["wall_s"] for a, b in itertools.pairwise(rows))
    assert not checkpoint.dir.exists()


def test_append_row_writes_the_header_once(tmp_path: Path) -> None:
    path = tmp_path / "curves.csv"
    rows = make_rows("TMaze100", "memoryless", 2, 500, [0.0, 1.0])
    for row in rows:
        learning.curve_store(path).append(row)
    assert learning.curve_store(path).read() == rows
    assert path.read_text().count("task,algo") == 1


def test_report_table_from_a_hand_made_csv(tmp_path: Path) -> None:
    config = quick_config(tmp_path, "--tasks", "RepeatFirstEasy", "--budget", "300")
    rows = (
        make_rows("RepeatFirstEasy", "amago", 0, 300, [0.5, 0.9, 1.0])
        + make_rows("RepeatFirstEasy", "amago", 1, 300, [0.5, 0.7, 0.8])
        + make_rows("RepeatFirstEasy", "ppo_lstm", 0, 300, [0.5, 0.6, 0.5])
        + make_rows("RepeatFirstEasy", "ppo_lstm", 1, 300, [0.5], finished=False)  # unfinished: left out
        + make_rows("RepeatFirstEasy", "memoryless", 5, 300, [1.0])  # a seed not configured: left out
    )
    config.store.write(rows)

    summaries = learning.summarize(config.store.read(), config)

    assert [(s.label, s.n_seeds) for s in summaries] == [("AMAGO", 2), ("RecurrentPPO", 1)]
    table = learning.results_table(summaries).splitlines()
    assert table[2] == "| RepeatFirstEasy | AMAGO | 2 | 0.900 ± 0.100 | 200 | 20 | 1/2 |"
    assert table[3] == "| RepeatFirstEasy | RecurrentPPO | 1 | 0.500 ± 0.000 | not reached | not reached | 0/1 |"


def test_write_report_files(tmp_path: Path) -> None:
    config = quick_config(tmp_path, "--tasks", "TMaze100", "--algos", "amago", "memoryless", "--budget", "300")
    config.store.write(
        make_rows("TMaze100", "amago", 0, 300, [0.0, 1.0]) + make_rows("TMaze100", "memoryless", 0, 300, [0.5, 0.5])
    )

    learning.write_report(config)

    report = (tmp_path / "learning_quick.md").read_text()
    assert "| TMaze100 | DQN | 1 | 0.500 ± 0.000 | not reached | not reached | 0/1 |" in report
    small = "transformer {'d_model': 128, 'n_heads': 8, 'd_ff': 512, 'n_layers': 3}"
    assert f"| TMaze100 | AMAGO | {small} | amago.yml: amago-TMaze100-v0 |" in report
    assert "| TMaze100 | DQN | none (MLP) | dqn.yml: CartPole-v1 |" in report
    figures = json.loads((tmp_path / "learning_quick.json").read_text())["figures"]
    assert figures["TMaze100 AMAGO env steps to 0.9"] == {"value": 100, "unit": "env steps (mean over seeds)"}
    assert (tmp_path / "learning_quick_TMaze100.png").stat().st_size > 0


def test_rows_written_before_the_trial_returns_and_commit_columns_still_read(tmp_path: Path) -> None:
    path = tmp_path / "old.csv"
    old_fields = [field for field in learning.FIELDS if field not in ("trial_returns", "commit")]
    path.write_text(",".join(old_fields) + "\nRepeatFirstEasy,amago,0,300,0,0.0,-1.0,0.0,0.25,1\n")
    (row,) = learning.curve_store(path).read()
    assert row["trial_returns"] == "" and row["commit"] == "" and row["score"] == 0.25 and row["final"] == 1


def test_appending_to_a_file_with_an_older_header_keeps_every_column(tmp_path: Path) -> None:
    path = tmp_path / "old.csv"
    old_fields = [field for field in learning.FIELDS if field != "commit"]
    path.write_text(",".join(old_fields) + "\nRepeatFirstEasy,amago,0,300,0,0.0,-1.0,0.0,0.25,,1\n")
    (new_row,) = make_rows("TMaze100", "amago", 0, 500, [0.5])
    learning.curve_store(path).append(new_row)
    old_row, read_back = learning.curve_store(path).read()
    assert old_row["commit"] == "" and old_row["score"] == 0.25
    assert read_back == new_row
    assert path.read_text().splitlines()[0] == ",".join(learning.FIELDS)


def test_a_run_records_the_commit_it_ran_on() -> None:
    import common

    commit = common.git_commit()
    assert commit == "unknown" or len(commit.split("+")[0]) == 10


def test_each_task_runs_its_own_algorithms() -> None:
    config = learning.parse_config(["--tasks", "RepeatPreviousEasy", "MazeRunner7", "--seeds", "0"])
    pairs = {(key.task, key.algo) for key in config.run_keys()}
    assert pairs == {
        *(("RepeatPreviousEasy", algo) for algo in ("amago", "ppo_lstm", "memoryless", "amago_gru", "amago_ff")),
        ("MazeRunner7", "amago"),
        ("MazeRunner7", "amago_no_relabel"),
    }


def test_amago_variants_change_only_their_part_of_the_entry() -> None:
    maze = learning.TASKS["MazeRunner7"]
    some = learning.run_settings(maze, "amago", maze.budget).kwargs
    none = learning.run_settings(maze, "amago_no_relabel", maze.budget).kwargs
    assert (some["relabeler"].strategy, none["relabeler"].strategy) == ("some", "none")
    assert {k: str(v) for k, v in some.items() if k != "relabeler"} == {k: str(v) for k, v in none.items() if k != "relabeler"}
    tmaze = learning.TASKS["TMaze100"]
    gru = learning.run_settings(tmaze, "amago_gru", tmaze.budget).kwargs["policy_kwargs"]
    transformer = learning.run_settings(tmaze, "amago", tmaze.budget).kwargs["policy_kwargs"]
    assert gru["traj_encoder"] == "gru" and gru["traj_encoder_kwargs"] == {}
    assert transformer["traj_encoder_kwargs"] == learning.SMALL_TRANSFORMER
    assert gru["timestep_encoder_kwargs"] == transformer["timestep_encoder_kwargs"]


def test_meta_rl_score_and_the_return_of_each_trial(tmp_path: Path) -> None:
    task = learning.TASKS["DarkKeyToDoor5"]
    per_trial = np.array([[0.0, 1.0, 2.0, 2.0, 2.0], [1.0, 1.0, 2.0, 2.0, 1.0]])  # (episodes, trials)
    assert task.score([], [], per_trial) == pytest.approx(per_trial.mean() / 2.0)
    config = learning.parse_config(["--tasks", "DarkKeyToDoor5", "--algos", "amago", "--out-dir", str(tmp_path)])
    for seed, trials in enumerate(("0.0;1.0;2.0;2.0;2.0", "1.0;1.0;2.0;2.0;1.0", "0.5;1.0;2.0;2.0;1.5")):
        for row in make_rows("DarkKeyToDoor5", "amago", seed, task.budget, [0.1, 0.7]):
            config.store.append({**row, "trial_returns": trials if row["final"] else ""})
    (summary,) = learning.summarize(config.store.read(), config)
    assert summary.final_trials.tolist() == pytest.approx([0.5, 1.0, 2.0, 2.0, 1.5])
    table = learning.trials_table([summary])
    assert "| DarkKeyToDoor5 | AMAGO | 3 | 0.50 | 1.00 | 2.00 | 2.00 | 1.50 | +1.00 |" in table


def test_swap_in_tasks_score_their_mean_return() -> None:
    """The swap-in benchmark builds its tasks on this module's Task (it failed to import when Task changed)."""
    import swap_in

    task = swap_in.TASKS["CartPole"]
    assert task.score_name == "mean return"
    assert task.score([100.0, 300.0], [], np.zeros((2, 0))) == 200.0
