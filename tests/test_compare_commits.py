"""benchmarks/compare_commits.py's --bound figure: the base's update time over the working tree's
matrix replay plus overhead floor, measured in a fresh process at the working tree's settings."""

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import compare_commits


def test_bound_divides_the_base_update_by_the_new_sides_matrix_replay_and_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_run_script(script, tree, threads, length, updates, precision="fp32", extra_env=None, compile_model=False):
        calls.append((tree, threads, length, updates, precision, compile_model, script))
        return json.dumps({"matrix_ms": 30.0, "overhead_floor_ms": 10.0, "update_ms": 45.0, "gflop_per_update": 5.3})

    monkeypatch.setattr(compare_commits, "run_script", fake_run_script)
    args = argparse.Namespace(threads=2, updates=7, compile=True)
    figure = compare_commits.bound(args, length=64, precision="bf16", base_updates_per_s=12.5)  # 80 ms an update
    assert figure["value"] == pytest.approx(80.0 / 40.0)
    assert figure["base_median_update_ms"] == 80.0
    assert (figure["matrix_ms"], figure["overhead_floor_ms"], figure["new_update_ms_same_process"]) == (30.0, 10.0, 45.0)
    assert calls == [(compare_commits.REPO, 2, 64, 7, "bf16", True, compare_commits.BOUND)], (
        "the working tree, at its own settings"
    )


def test_bound_script_reports_what_the_figure_reads() -> None:
    out = json.loads(compare_commits.run_script(compare_commits.BOUND, compare_commits.REPO, 1, 8, 1))
    assert out["matrix_ms"] > 0 and out["overhead_floor_ms"] > 0 and out["update_ms"] > 0 and out["gflop_per_update"] > 0
