"""benchmarks/attention_threshold.py: each side's model runs its own attention backend, the sides
alternate, and the reported threshold is where the math backend stops being faster."""

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch as th

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import attention_threshold
import bench_updates

from sb3_amago.nets import cpu_kernels, transformer


class _AttentionOps(th.utils._python_dispatch.TorchDispatchMode):
    """Names of the attention operators run inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if "attention" in str(func):
            self.names.append(str(func))  # e.g. aten._scaled_dot_product_flash_attention_for_cpu.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("side", list(attention_threshold.BACKENDS))
def test_each_side_runs_its_own_backend(side: str) -> None:
    cpu_kernels.load()  # where they build, the package's kernels are what the block must set aside
    q, k, v = (th.randn(2, 2, 9, 16) for _ in range(3))
    package_value, package_choice = transformer.CPU_MATH_ATTENTION_MAX_STEPS, cpu_kernels.CHOICE
    with attention_threshold.torch_backend(side), _AttentionOps() as ops:
        transformer.causal_attention(q, k, v)
    ran_flash = any("flash" in name for name in ops.names)
    assert ran_flash == (side == "flash"), ops.names
    assert not any("sb3_amago" in name for name in ops.names)  # the package's own kernel set aside
    # restored after the block
    assert transformer.CPU_MATH_ATTENTION_MAX_STEPS == package_value and cpu_kernels.CHOICE == package_choice


def test_the_sides_alternate_each_under_its_own_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, int]] = []

    class FakeModel:
        def __init__(self, name: str) -> None:
            self.name = name

        def train(self, gradient_steps: int, batch_size: int) -> None:
            seen.append((self.name, transformer.CPU_MATH_ATTENTION_MAX_STEPS))

    def fake_trained_model(length: int, compile_model: bool = False) -> FakeModel:
        built = transformer.CPU_MATH_ATTENTION_MAX_STEPS  # the setting the model is traced with
        return FakeModel("math" if built == attention_threshold.BACKENDS["math"] else "flash")

    monkeypatch.setattr(bench_updates, "trained_model", fake_trained_model)
    rates = attention_threshold.backend_rates(64, rounds=3, updates=2, compile_model=False)
    assert {name: len(r) for name, r in rates.items()} == {"math": 3, "flash": 3}
    timed = seen[2:]  # after each model's warm-up
    assert [name for name, _ in timed] == ["math", "flash", "flash", "math", "math", "flash"]
    assert all(threshold == attention_threshold.BACKENDS[name] for name, threshold in seen)


@pytest.mark.parametrize(
    "ratios, expected",
    [
        ({64: 1.06, 128: 1.10, 192: 0.96, 256: 0.87}, 129),
        ({64: 0.98, 128: 1.10}, 0),
        ({64: 1.05, 128: 0.99, 192: 1.02}, 65),  # faster again further on does not count
        ({256: 1.01, 64: 1.2}, 257),  # the windows' order on the command line does not matter
    ],
)
def test_math_faster_up_to(ratios: dict[int, float], expected: int) -> None:
    figures = {f"L{length}": {"value": ratio, "steps": length + 1} for length, ratio in ratios.items()}
    assert attention_threshold.math_faster_up_to(figures) == expected


def test_results_hold_each_window_and_the_package_value(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = {
        64: {"math": [11.0, 12.0, 13.0], "flash": [10.0, 10.0, 10.0]},
        128: {"math": [9.0, 9.0, 11.0], "flash": [10.0] * 3},
    }
    monkeypatch.setattr(attention_threshold, "measure_in_fresh_process", lambda length, args: fake[length])
    monkeypatch.setattr(sys, "argv", ["attention_threshold.py", "--lengths", "64", "128", "--name", str(tmp_path / "att")])
    attention_threshold.main()
    figures = json.loads((tmp_path / "att.json").read_text())["figures"]
    assert figures["math_over_flash_L64"]["value"] == 1.2 and figures["math_over_flash_L64"]["rounds_math_faster"] == "3/3"
    assert figures["math_over_flash_L128"]["value"] == 0.9 and figures["math_over_flash_L128"]["steps"] == 129
    assert figures["math_faster_up_to_steps"]["value"] == 65
    assert (
        figures["math_faster_up_to_steps"]["package_cpu_math_attention_max_steps"] == transformer.CPU_MATH_ATTENTION_MAX_STEPS
    )
