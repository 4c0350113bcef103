"""benchmarks/bench_updates.py: the overhead floor (the reference update's operators at width 8) and the
replay of the update's matrix products and their FLOP count."""

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch as th

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_updates
from bench_updates import (
    CPU_ATTENTION_FLOPS,
    FLOOR_POLICY,
    TensorSpec,
    every_product_routed,
    operators_per_update,
    replay_seconds,
    trained_model,
)
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from sb3_amago.nets.transformer import causal_math_attention


@pytest.mark.parametrize("mixed_precision", [False, True])
def test_overhead_floor_runs_the_reference_operators(mixed_precision: bool) -> None:
    """The same operators, products on the same library (at L = 8 the reference's are on both sides
    of the oneDNN threshold, so both run with it lifted, as the benchmark runs the floor)."""
    with every_product_routed():
        reference = trained_model(8, mixed_precision)
        floor = trained_model(8, mixed_precision, policy_kwargs=FLOOR_POLICY)
        assert operators_per_update(floor) == operators_per_update(reference)
    n_params = [sum(p.numel() for p in model.policy.parameters()) for model in (floor, reference)]
    assert n_params[0] * 100 < n_params[1]


def test_replay_times_each_product_alone_at_its_best(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each recorded product runs on its own tensors of the recorded layout, once untimed and then
    ``repeats`` timed runs; the replay's time is the sum of each product's best run."""
    ran: list[tuple[tuple[int, ...], tuple[int, ...], int]] = []

    def product(a: th.Tensor, b: th.Tensor) -> th.Tensor:
        ran.append((tuple(a.shape), tuple(b.stride()), id(a)))
        return a @ b

    calls = [
        (product, (TensorSpec((3, 4), (4, 1), th.float32), TensorSpec((4, 2), (1, 4), th.float32)), {}),
        (product, (TensorSpec((5, 4), (4, 1), th.float32), TensorSpec((4, 6), (6, 1), th.float32)), {}),
    ]
    timed_runs = iter([0.5, 0.2, 0.3, 0.1, 0.4, 0.4])  # the first product's three runs, then the second's
    monkeypatch.setattr(bench_updates, "_timed", lambda fn: (fn(), next(timed_runs))[1])
    assert replay_seconds(calls, repeats=3) == pytest.approx(0.2 + 0.1)
    assert [(shape, stride) for shape, stride, _ in ran] == [((3, 4), (1, 4))] * 4 + [((5, 4), (6, 1))] * 4
    assert len({tensor for _, _, tensor in ran[:4]}) == 1  # the same operands for a product's runs


def test_flash_attention_counts_the_math_backends_flops() -> None:
    """The CPU flash-attention kernels, forward and backward, count what the math backend's batched
    products count for the same attention (the update takes one or the other by window length)."""

    def flops(attention: Callable[[th.Tensor, th.Tensor, th.Tensor], th.Tensor]) -> dict[str, int]:
        q, k, v = (th.randn(2, 3, 7, 4, requires_grad=True) for _ in range(3))
        with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOPS) as counter:
            attention(q, k, v).sum().backward()
        return {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}

    flash = flops(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    math = flops(causal_math_attention)
    assert set(flash) == {
        "aten._scaled_dot_product_flash_attention_for_cpu",
        "aten._scaled_dot_product_flash_attention_for_cpu_backward",
    }
    assert sum(flash.values()) == sum(math.values()) == 12 * 2 * 3 * 7 * 7 * 4  # six products of 2 B H L L Dh


def test_reference_batches_are_full_windows() -> None:
    """The timed updates run at the window length they are reported for: every batch ``L + 1`` wide."""
    model = trained_model(64)  # the earlier fill (L + 64 steps) gave one batch in 300 narrower here, a fifth at L = 256
    assert {model.replay_buffer.sample(8, env=None).real.shape[1] for _ in range(300)} == {65}


def test_reference_model_is_repeatable_and_same_values_lists_what_differs() -> None:
    """``parameters_after_updates`` is a function of the seed alone (the envs draw from their seeded
    generators), so ``same_values.py`` can hold two versions of the package to bit-for-bit equal
    states; its ``differences`` names each differing tensor with its largest absolute difference."""
    from same_values import differences

    threads = th.get_num_threads()
    th.set_num_threads(1)
    try:
        first = bench_updates.parameters_after_updates(8, 1)
        second = bench_updates.parameters_after_updates(8, 1)
    finally:
        th.set_num_threads(threads)
    assert differences(first, second) == {}
    moved = {**first, "gamma_values": first["gamma_values"] * 2.0}
    del moved["popart.w"]
    largest = first["gamma_values"].abs().max().item()
    assert differences(first, moved) == {"gamma_values": pytest.approx(largest), "popart.w": None}
