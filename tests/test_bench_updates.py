"""benchmarks/bench_updates.py's overhead floor: the reference update's operators at width 8."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_updates import FLOOR_POLICY, every_product_routed, operators_per_update, trained_model


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
