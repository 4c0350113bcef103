"""benchmarks/layer_norm_backward.py: alone, it times torch's kernel against inductor's decomposition
of the same backward; inside the update (benchmarks/table_entries.py), one side is the package's compiled
update and the other the same without the table's layer-norm entry, whose graph decomposes that backward."""

import json
import sys
from pathlib import Path

import pytest
import torch._inductor.compile_fx as compile_fx_module

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import layer_norm_backward
import table_entries


def test_alone_times_both_sides_warm_and_flushed() -> None:
    figures = layer_norm_backward.alone(length=4, repeats=3)
    sides = ("torch_kernel", "inductor_decomposition")
    assert set(figures) == {f"alone_{side}_{cache}_us" for side in sides for cache in ("warm", "flushed")}
    assert all(figure["value"] > 0 for figure in figures.values())
    assert "(40, 512)" in figures["alone_torch_kernel_warm_us"]["unit"]


@pytest.mark.slow
def test_inside_updates_compares_the_package_with_its_table_without_the_layer_norm_entry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with_entry = []
    compile_fx = compile_fx_module.compile_fx

    def recording(graph, example_inputs, **kwargs):
        with_entry.append(layer_norm_backward.LAYER_NORM_BACKWARD in (kwargs.get("decompositions") or {}))
        return compile_fx(graph, example_inputs, **kwargs)

    monkeypatch.setattr(compile_fx_module, "compile_fx", recording)
    monkeypatch.setattr(layer_norm_backward, "RESULTS_DIR", tmp_path)
    argv = ["layer_norm_backward.py", "--threads", "1", "--length", "8", "--repeats", "3", "--rounds", "2", "--updates", "2"]
    monkeypatch.setattr(sys, "argv", argv)
    layer_norm_backward.main()
    assert True in with_entry and False in with_entry  # the package's table on one side, without the entry on the other
    figures = json.loads((tmp_path / "layer_norm_backward_L8.json").read_text())["figures"]
    assert figures["update_speedup"]["rounds"] == 2
    assert figures["update_ms_package"]["value"] > 0 and figures["update_ms_other"]["value"] > 0
    assert figures["update_ms_other"]["without"] == ["aten.native_layer_norm_backward.default"]


def test_table_entries_takes_only_the_package_tables_operators() -> None:
    with pytest.raises(ValueError, match="--without takes operators of the package's table.*aten.mm.default"):
        table_entries.inside_updates(8, 1, 1, ["aten.mm.default"])
    with pytest.raises(ValueError, match="got none"):
        table_entries.inside_updates(8, 1, 1, [])
