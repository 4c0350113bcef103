"""benchmarks/optimizer_step.py: the two sides of its alternation are the C++ step and torch's, each
timed over the same number of updates, and the package's choice of step is restored afterwards."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import optimizer_step

from sb3_amago import clipped_step as clipped_step_module
from sb3_amago.nets import cpu_kernels


@pytest.mark.skipif(not cpu_kernels.buildable(), reason="the C++ step is part of the package's CPU kernels")
def test_the_sides_are_the_native_step_and_torchs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    original = clipped_step_module.native_step_lists
    native_steps = []

    def counted(*args):
        lists = original(*args)
        native_steps.append(lists is not None)
        return lists

    monkeypatch.setattr(clipped_step_module, "native_step_lists", counted)
    monkeypatch.setattr(optimizer_step, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(sys, "argv", ["optimizer_step.py", "--threads", "1", "--length", "8", "--rounds", "2"])
    optimizer_step.main()
    assert clipped_step_module.native_step_lists is counted  # restored
    # the reference model's 3 warm-up updates (the first makes the optimizer's state, in torch's step),
    # then 10 warm-up updates and 2 rounds of 10 on the native side; the torch side never asks
    assert native_steps == [False, True, True] + [True] * 30
    figures = json.loads((tmp_path / "optimizer_step.json").read_text())["figures"]
    assert figures["clip_and_step_ms_native"]["value"] > 0 and figures["clip_and_step_ms_torch"]["value"] > 0
    assert figures["update_speedup"]["rounds"] == 2
