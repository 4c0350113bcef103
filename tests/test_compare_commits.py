"""benchmarks/compare_commits.py: the rounds of fresh processes every timing benchmark measures with,
and the --bound figure (the base's update time over the working tree's matrix replay plus overhead
floor, measured in a fresh process at the working tree's settings)."""

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


def fake_rates(monkeypatch: pytest.MonkeyPatch, rates: dict[str, float]) -> list[tuple]:
    """Patch ``measure`` to return ``rates[precision]``; the calls are appended to the returned list."""
    calls: list[tuple] = []

    def fake_measure(tree, threads, length, updates, precision="fp32", extra_env=None, compile_model=False):
        calls.append((tree, precision, extra_env, compile_model))
        return rates[precision] * (1 + len(calls) / 100)

    monkeypatch.setattr(compare_commits, "measure", fake_measure)
    monkeypatch.setattr(compare_commits, "load_average", lambda: 0.5 + len(calls))
    return calls


def test_rounds_measure_each_setting_with_its_own_arguments_in_a_fixed_order(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_rates(monkeypatch, {"fp32": 10.0, "bf16": 20.0})
    settings = {
        "base": {"tree": Path("/base"), "precision": "fp32"},
        "new": {"precision": "bf16", "extra_env": {"X": "1"}, "compile_model": True},
    }
    result = compare_commits.measure_rounds(settings, threads=2, length=8, updates=3, rounds=3)
    base, new = (Path("/base"), "fp32", None, False), (compare_commits.REPO, "bf16", {"X": "1"}, True)
    assert calls == [base, new] * 3, "the working tree unless a tree is given; the same order every round"
    assert result.runs["base"] == pytest.approx([10.1, 10.3, 10.5]) and result.runs["new"] == pytest.approx([20.4, 20.8, 21.2])
    assert result.ratios("new", "base") == pytest.approx([20.4 / 10.1, 20.8 / 10.3, 21.2 / 10.5])
    assert result.median("new") == pytest.approx(20.8)
    assert result.loads == [0.5 + n for n in range(6)] and result.load_range == "0.50-5.50"


def test_alternating_rounds_reverse_the_order_every_other_round(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_rates(monkeypatch, {"fp32": 10.0, "bf16": 20.0})
    settings = {"a": {"precision": "fp32"}, "b": {"precision": "bf16"}}
    result = compare_commits.measure_rounds(settings, threads=1, length=8, updates=1, rounds=3, alternate=True)
    assert [precision for _, precision, _, _ in calls] == ["fp32", "bf16", "bf16", "fp32", "fp32", "bf16"]
    assert result.runs["a"] == pytest.approx([10.1, 10.4, 10.5]), "each setting's rates stay in round order"
