"""benchmarks/run_table.py: runs of one task from several labelled CSVs, side by side."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from curves import CurveStore
from learning import FIELDS
from run_table import main


def write_run(
    path: Path, seed: int, scores: list[float], trials: list[list[float]], finished: bool = True, algo: str = "amago"
) -> None:
    store = CurveStore(path, FIELDS)
    for i, (score, trial) in enumerate(zip(scores, trials, strict=True)):
        store.append(
            {
                "task": "DarkKeyToDoor5",
                "algo": algo,
                "seed": seed,
                "budget": 100,
                "env_steps": 10 * i,
                "wall_s": float(i),
                "mean_return": 2 * score,
                "std_return": 0.0,
                "score": score,
                "trial_returns": ";".join(str(x) for x in trial),
                "final": int(finished and i == len(scores) - 1),
                "commit": "abcdef1234",
            }
        )


def two_labels(tmp_path: Path, x_finals: list[float], y_finals: list[float]) -> list[str]:
    """One finished two-evaluation run per final score, label x in a.csv and y in b.csv; returns
    run_table's arguments for them."""
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    for path, finals in ((a, x_finals), (b, y_finals)):
        for seed, score in enumerate(finals):
            write_run(path, seed, [0.0, score], [[0, 0], [0, 0]])
    return ["--task", "DarkKeyToDoor5", "--runs", f"x={a}", f"y={b}", "--out-dir", str(tmp_path), "--name", "t"]


def test_run_table_summarises_each_run_and_each_label_over_its_finished_runs(tmp_path: Path) -> None:
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    write_run(a, 0, [0.0, 0.2, 0.4, 0.6], [[0, 0], [0, 1], [1, 2], [1, 3]])
    write_run(a, 1, [0.0, 0.4, 0.2, 0.2], [[0, 0], [1, 1], [2, 2], [2, 2]])
    write_run(a, 1, [0.9] * 4, [[9, 9]] * 4, algo="ppo_lstm")  # another algorithm: not read
    write_run(b, 0, [0.0, 0.5], [[0, 0], [1, 1]], finished=False)
    main(["--task", "DarkKeyToDoor5", "--runs", f"x={a}", f"y={b}", "--last", "2", "--out-dir", str(tmp_path), "--name", "t"])
    payload = json.loads((tmp_path / "t.json").read_text())
    runs = {(run["label"], run["seed"]): run for run in payload["runs"]}
    assert set(runs) == {("x", 0), ("x", 1), ("y", 0)}
    assert runs[("x", 0)]["final"] == pytest.approx(0.6)
    assert runs[("x", 0)]["last_mean"] == pytest.approx(0.5)
    assert runs[("x", 0)]["auc"] == pytest.approx(0.3)
    assert runs[("x", 0)]["trials"] == pytest.approx([1.0, 2.5])
    assert not runs[("y", 0)]["finished"] and runs[("y", 0)]["env_steps"] == 10
    (x,) = [s for s in payload["per_label"] if s["label"] == "x"]
    assert x["runs"] == 2
    assert x["last_mean"] == pytest.approx([0.35, 0.15])  # seeds at 0.5 and 0.2
    assert x["trial_rise"] == pytest.approx([0.75, 0.75])  # 2.5 - 1.0 and 2.0 - 2.0
    assert [s["label"] for s in payload["per_label"]] == ["x"], "a label with no finished run has no summary"
    report = (tmp_path / "t.md").read_text()
    assert "| x | 0 | abcdef1 | 30 | 0.600 |" in report, "a finished run is not marked unfinished"
    assert "| y | 0 | abcdef1 | 10 (unfinished) |" in report


def test_run_table_names_the_fix_for_a_bad_runs_argument(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="LABEL=CSV"):
        main(["--task", "DarkKeyToDoor5", "--runs", str(tmp_path / "a.csv")])
    with pytest.raises(SystemExit, match="does not exist"):
        main(["--task", "DarkKeyToDoor5", "--runs", f"x={tmp_path / 'a.csv'}"])


def test_run_table_reads_every_algorithm_asked_for_as_separate_runs(tmp_path: Path) -> None:
    """``--algo amago amago_bf16``: a variant's rows count, each (algorithm, seed) a run of its own."""
    a = tmp_path / "a.csv"
    write_run(a, 0, [0.1, 0.3], [[0, 0], [0, 0]])
    write_run(a, 0, [0.5, 0.7], [[0, 0], [0, 0]], algo="amago_bf16")
    write_run(a, 0, [0.9, 0.9], [[0, 0], [0, 0]], algo="ppo_lstm")
    args = ["--task", "DarkKeyToDoor5", "--runs", f"x={a}", "--out-dir", str(tmp_path), "--name", "t"]
    main([*args, "--algo", "amago", "amago_bf16"])
    payload = json.loads((tmp_path / "t.json").read_text())
    assert {run["algo"]: run["final"] for run in payload["runs"]} == pytest.approx({"amago": 0.3, "amago_bf16": 0.7})
    with pytest.raises(SystemExit, match="no rows of task"):
        main([*args, "--algo", "amago_gru"])


def test_permutation_pvalues_count_every_relabelling_or_a_seeded_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    import run_table

    # reference [0, 1], other [2, 3]: of the 6 relabellings, only the observed one has a difference
    # as high as +2, and every one is at most +2.
    assert run_table.permutation_pvalues([0.0, 1.0], [2.0, 3.0]) == pytest.approx((1.0, 1 / 6))
    # ties count on both sides: [0, 1, 2] against [1] is a difference of 0, and 2 of 4 relabellings are 0.
    assert run_table.permutation_pvalues([0.0, 1.0, 2.0], [1.0]) == pytest.approx((3 / 4, 3 / 4))
    rng = np.random.default_rng(3)
    reference, other = rng.normal(0.0, 1.0, 7).tolist(), rng.normal(0.8, 1.0, 6).tolist()
    exact = run_table.permutation_pvalues(reference, other)
    monkeypatch.setattr(run_table, "EXACT_RELABELLINGS", 0)
    sampled = run_table.permutation_pvalues(reference, other)
    assert sampled == run_table.permutation_pvalues(reference, other), "the sample is seeded"
    assert sampled == pytest.approx(exact, abs=0.01)  # 100,000 draws: standard error below 0.002
    assert exact[0] + exact[1] >= 1.0  # the observed labelling is in both tails


def test_run_table_tests_each_label_against_the_reference(tmp_path: Path) -> None:
    args = two_labels(tmp_path, [0.1, 0.2, 0.3], [0.4, 0.5])
    write_run(tmp_path / "b.csv", 9, [0.0, 0.9], [[0, 0], [0, 0]], finished=False)  # unfinished: not tested
    main(args)
    (c,) = json.loads((tmp_path / "t.json").read_text())["against_reference"]
    assert (c["label"], c["reference"], c["runs"], c["reference_runs"]) == ("y", "x", 2, 3)
    # y's two runs are the top two of five: 1 relabelling of C(5, 2) = 10 as high.
    assert c["final"]["difference"] == pytest.approx(0.45 - 0.2)
    assert (c["final"]["p_lower"], c["final"]["p_higher"]) == pytest.approx((1.0, 0.1))
    assert "| y | 2 vs 3 | +0.250 (p 1.000 / 0.100) |" in (tmp_path / "t.md").read_text()
    main([*args, "--reference", "y"])
    (c,) = json.loads((tmp_path / "t.json").read_text())["against_reference"]
    assert c["label"] == "x" and c["final"]["p_lower"] == pytest.approx(0.1)
    with pytest.raises(SystemExit, match="not one of the --runs labels"):
        main([*args, "--reference", "z"])


def test_a_margin_tests_that_a_label_is_not_worse_than_the_reference_by_it(tmp_path: Path) -> None:
    args = two_labels(tmp_path, [0.1, 0.2, 0.3], [0.15, 0.25])
    main([*args, "--margin", "0.5"])
    (c,) = json.loads((tmp_path / "t.json").read_text())["against_reference"]
    # raised by 0.5, y's runs (0.65, 0.75) are the top two of five: 1 relabelling of 10 as high.
    assert c["margin"] == 0.5 and c["final"]["p_not_worse_by_margin"] == pytest.approx(0.1)
    assert c["final"]["difference"] == pytest.approx(0.0), "the difference itself is not shifted"
    assert "Non-inferiority with a margin of 0.5" in (tmp_path / "t.md").read_text()
    main([*args, "--margin", "0"])
    (c,) = json.loads((tmp_path / "t.json").read_text())["against_reference"]
    assert c["final"]["p_not_worse_by_margin"] == c["final"]["p_higher"], "no margin: the plain p higher"
    main(args)
    (c,) = json.loads((tmp_path / "t.json").read_text())["against_reference"]
    assert "p_not_worse_by_margin" not in c["final"] and "Non-inferiority" not in (tmp_path / "t.md").read_text()
