"""benchmarks/bench_updates.py: the overhead floor (the reference update's operators at width 8) and the
replay of the update's matrix products."""

import sys
from pathlib import Path

import pytest
import torch as th

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_updates
from bench_updates import FLOOR_POLICY, TensorSpec, every_product_routed, operators_per_update, replay_seconds, trained_model


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
