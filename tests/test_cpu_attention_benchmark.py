"""benchmarks/cpu_attention.py: each side of the whole-update comparison runs under its own setting,
the sides alternate, and the kernel figures name torch's two kernels beside the package's."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import cpu_attention as benchmark

from sb3_amago.nets import cpu_kernels


def test_the_update_sides_alternate_each_under_its_own_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []

    class FakeModel:
        def __init__(self, name: str) -> None:
            self.name = name

        def train(self, gradient_steps: int, batch_size: int) -> None:
            seen.append((self.name, cpu_kernels.CHOICE))

    def fake_trained_model(length: int, compile_model: bool = False) -> FakeModel:
        return FakeModel("torch" if cpu_kernels.CHOICE == "torch" else "package")  # the setting it is traced with

    monkeypatch.setattr(benchmark, "trained_model", fake_trained_model)
    figure = benchmark.update_figure(64, rounds=3, updates=2)
    assert [name for name, _ in seen] == ["torch", "package", "package", "torch", "torch", "package"]
    assert all((choice == "torch") == (name == "torch") for name, choice in seen)
    assert len(figure["ratios"]) == 3 and figure["rounds_package_faster"].endswith("/3")


@pytest.mark.skipif(not cpu_kernels.load(), reason="the package's CPU kernels are not built on this CPU")
def test_kernel_figures_time_the_package_beside_torchs_kernels() -> None:
    figure = benchmark.kernel_figures([8], repeats=1)["attention_L8"]
    assert figure["steps"] == 9 and figure["value"] > 0
    assert figure["torch_math_compiled_ms"] > 0 and figure["torch_flash_ms"] > 0


@pytest.mark.skipif(not cpu_kernels.load(), reason="the package's CPU kernels are not built on this CPU")
def test_against_a_revision_the_kernels_run_on_one_input_and_their_values_are_compared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    built: list[list[Path]] = []

    def fake_build(sources: list[Path], capability: str) -> object:
        built.append(sources)
        return cpu_kernels.kernels()  # the working tree's own kernels stand in for the revision's

    monkeypatch.setattr(cpu_kernels, "build", fake_build)
    figure = benchmark.base_figures("HEAD", [8], rounds=2, repeats=1)["against_base_L8"]
    assert [source.name for source in built[0]] == [source.name for source in cpu_kernels.SOURCES]
    assert all(cpu_kernels.SOURCES[0].parent not in source.parents for source in built[0])  # the revision's files
    assert figure["same_values"] is True and figure["steps"] == 9 and figure["value"] > 0
    assert set(figure["forward_ms"]) == set(figure["backward_ms"]) == {"base", "working_tree"}
