"""benchmarks/dynamic_axes.py: the package's compiled update (only the time axis dynamic) against one
compiled with every size dynamic, alternated in one process."""

import json
import sys
from pathlib import Path

import pytest
import torch as th

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import dynamic_axes


@pytest.mark.slow
def test_it_times_both_compiles_and_writes_their_figures(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    compiles = []
    compile_ = th.compile

    def recording(fn, *args, **kwargs):
        compiles.append(kwargs.get("dynamic"))
        return compile_(fn, *args, **kwargs)

    monkeypatch.setattr(th, "compile", recording)
    monkeypatch.setattr(dynamic_axes, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(sys, "argv", ["dynamic_axes.py", "--threads", "1", "--length", "8", "--rounds", "2", "--updates", "2"])
    dynamic_axes.main()
    assert sorted(compiles, key=str) == [None, True]  # the package's compile and every size dynamic
    figures = json.loads((tmp_path / "dynamic_axes_L8.json").read_text())["figures"]
    assert figures["update_speedup"]["rounds"] == 2
    assert figures["update_ms_package"]["value"] > 0 and figures["update_ms_other"]["value"] > 0
