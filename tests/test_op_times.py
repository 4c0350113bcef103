"""benchmarks/op_times.py's timer: every operator call is counted once, matrix products apart."""

import sys
from pathlib import Path

import pytest
import torch as th

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from op_times import OperatorTimer


def test_operator_timer_counts_each_call_and_the_matrix_products() -> None:
    a = th.randn(64, 64, requires_grad=True)
    b = th.randn(64, 64)
    timer = OperatorTimer()
    with timer:
        out = th.nn.functional.leaky_relu(a @ b).sum()
        out.backward()
    assert timer.calls["mm"] >= 2  # forward, and the gradient of a in the backward
    assert timer.calls["leaky_relu"] == 1 and timer.calls["leaky_relu_backward"] == 1
    assert sum(timer.by_shape.values()) == pytest.approx(sum(timer.seconds.values()))
    assert 0.0 < timer.matrix_seconds < sum(timer.seconds.values())
    assert th.allclose(a.grad, th.where(a @ b > 0, 1.0, 0.01) @ b.T)
