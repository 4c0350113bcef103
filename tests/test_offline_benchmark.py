"""benchmarks/offline.py: a --quick run of its cells (seconds), resuming, the scripted expert."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_offline_benchmark_quick_run_writes_rows_and_report(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/offline.py --quick: the offline cells (AMAGO and pure BC on a Minari dataset of the
    scripted expert) and offline-to-online write their rows and the report; a rerun skips finished runs."""
    pytest.importorskip("minari")
    import offline

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    argv = ["--quick", "--out-dir", str(tmp_path), "--seeds", "0", "--cells", "expert_amago", "expert_bc", "o2o"]
    offline.main(argv)
    rows = offline.CurveStore(tmp_path / "offline_quick_curves.csv", offline.FIELDS).read()
    assert {r["cell"] for r in rows if r["final"]} == {"expert_amago", "expert_bc", "o2o"}
    assert all(r["env_steps"] == 0 for r in rows if r["cell"] != "o2o"), "offline cells take no env step"
    assert max(r["updates"] for r in rows if r["cell"] == "expert_bc") == 8
    assert "| expert_amago |" in (tmp_path / "offline_quick.md").read_text()
    offline.main(argv)
    assert len(offline.CurveStore(tmp_path / "offline_quick_curves.csv", offline.FIELDS).read()) == len(rows)
    # The scripted expert solves the task.
    episode = offline.record_episodes(1, 0.0, seed=3)[0]
    assert episode["rewards"].sum() == pytest.approx(offline.EXPERT_RETURN)
