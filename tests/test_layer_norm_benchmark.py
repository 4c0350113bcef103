"""benchmarks/layer_norm_backward.py: alone, it times torch's kernel against inductor's decomposition
of the same backward; inside the update, one side is the package's compiled update and the other plain
inductor, whose graph decomposes the layer norm's backward."""

import json
import sys
from pathlib import Path

import pytest
import torch._inductor.compile_fx as compile_fx_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import layer_norm_backward


def test_alone_times_both_sides_warm_and_flushed() -> None:
    figures = layer_norm_backward.alone(length=4, repeats=3)
    sides = ("torch_kernel", "inductor_decomposition")
    assert set(figures) == {f"alone_{side}_{cache}_us" for side in sides for cache in ("warm", "flushed")}
    assert all(figure["value"] > 0 for figure in figures.values())
    assert "(40, 512)" in figures["alone_torch_kernel_warm_us"]["unit"]


@pytest.mark.slow
def test_inside_updates_compares_the_package_with_plain_inductor(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    compiled_graphs = []
    compile_fx = compile_fx_module.compile_fx

    def recording(graph, example_inputs, **kwargs):
        compiled_graphs.append("decompositions" in kwargs and kwargs["decompositions"] is not None)
        return compile_fx(graph, example_inputs, **kwargs)

    monkeypatch.setattr(compile_fx_module, "compile_fx", recording)
    monkeypatch.setattr(layer_norm_backward, "RESULTS_DIR", tmp_path)
    argv = ["layer_norm_backward.py", "--threads", "1", "--length", "8", "--repeats", "3", "--rounds", "2", "--updates", "2"]
    monkeypatch.setattr(sys, "argv", argv)
    layer_norm_backward.main()
    assert True in compiled_graphs and False in compiled_graphs  # the package's table on one side, inductor's on the other
    figures = json.loads((tmp_path / "layer_norm_backward_L8.json").read_text())["figures"]
    assert figures["update_speedup"]["rounds"] == 2
    assert figures["update_ms_package"]["value"] > 0 and figures["update_ms_plain_inductor"]["value"] > 0
