"""The layer norm's backward as torch's kernel in compiled CPU code (sb3_amago/nets/layer_norm.py,
sb3_amago/compiled_update.py)."""

import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch as th
from torch._dynamo.utils import counters
from torch._functorch.aot_autograd import aot_function, make_boxed_func
from torch._inductor.utils import run_and_get_code
from torch.nn import functional as F

from sb3_amago import compiled_update
from sb3_amago.compiled_update import CpuInductor, compile_update, cpu_backend
from sb3_amago.nets import cpu_kernels, layer_norm

OPERATOR = th.ops.sb3_amago.layer_norm_backward.default


def _inputs(dtype: th.dtype = th.float32, seed: int = 0) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
    generator = th.Generator().manual_seed(seed)
    x = th.randn(3, 5, 24, generator=generator).to(dtype)
    weight = th.randn(24, generator=generator).to(dtype)
    bias = th.randn(24, generator=generator).to(dtype)
    return x, weight, bias


@pytest.mark.parametrize("native", [False, True])
def test_operator_gives_torchs_gradients_bit_for_bit(native: bool) -> None:
    """The operator's Python kernel and its C++ one (the package's CPU kernels) return what
    ``aten.native_layer_norm_backward`` does, at any input strides."""
    if native and not cpu_kernels.load():
        pytest.skip("the package's CPU kernels are not built here")
    x, weight, bias = _inputs()
    x = x.transpose(0, 1)  # not contiguous: the gradients come back contiguous all the same
    out, mean, rstd = th.ops.aten.native_layer_norm(x, [24], weight, bias, 1e-5)
    grad = th.randn_like(out)
    expected = th.ops.aten.native_layer_norm_backward(grad, x, [24], mean, rstd, weight, bias, [True, True, True])
    kernel = OPERATOR if native else layer_norm._layer_norm_backward
    got = kernel(grad, x, [24], mean, rstd, weight, bias)
    assert all(th.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert got[0].is_contiguous()


def _traced_backward(fn: Callable[..., th.Tensor], *args: th.Tensor) -> tuple[th.fx.GraphModule, tuple[Any, ...]]:
    """The backward graph AOT autograd traces for ``fn`` with the package's decomposition table, and
    the gradients of ``args`` it gives (the graphs run as traced)."""
    graphs: list[th.fx.GraphModule] = []

    def keep(gm: th.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        graphs.append(gm)
        return make_boxed_func(gm)

    traced = aot_function(
        fn,
        fw_compiler=lambda gm, _: make_boxed_func(gm),
        bw_compiler=keep,
        decompositions=compiled_update.inductor_decompositions(),
    )
    traced(*args).sum().backward()
    return graphs[0], tuple(a.grad for a in args if a.requires_grad)


def _eager_gradients(fn: Callable[..., th.Tensor], *args: th.Tensor) -> tuple[Any, ...]:
    fn(*args).sum().backward()
    return tuple(a.grad for a in args if a.requires_grad)


def _leaves(*tensors: th.Tensor, grad: tuple[bool, ...]) -> list[th.Tensor]:
    return [t.clone().requires_grad_(g) for t, g in zip(tensors, grad, strict=True)]


def _uses_operator(graph: th.fx.GraphModule) -> bool:
    return any(node.target is OPERATOR for node in graph.graph.nodes)


def test_fp32_cpu_layer_norm_backward_becomes_the_operator() -> None:
    """An fp32 CPU layer norm with a weight and a bias, every gradient asked for: the traced backward
    calls the operator, with eager code's gradients up to the forward statistics' rounding."""
    x, weight, bias = _inputs()

    def fn(x: th.Tensor, weight: th.Tensor, bias: th.Tensor) -> th.Tensor:
        return F.layer_norm(x * 2.0, [24], weight, bias) * th.arange(24.0)

    graph, traced = _traced_backward(fn, *_leaves(x, weight, bias, grad=(True, True, True)))
    assert _uses_operator(graph)
    th.testing.assert_close(traced, _eager_gradients(fn, *_leaves(x, weight, bias, grad=(True, True, True))))


@pytest.mark.parametrize("case", ["input needs no gradient", "no affine parameters", "bf16"])
def test_other_layer_norms_keep_inductors_decomposition(case: str) -> None:
    """Where the operator does not fit (an input without a gradient, no weight and bias, another
    dtype), the backward is inductor's own decomposition, with eager code's gradients."""
    x, weight, bias = _inputs(th.bfloat16 if case == "bf16" else th.float32)
    if case == "no affine parameters":

        def fn(x: th.Tensor) -> th.Tensor:
            return F.layer_norm(x, [24]) * th.arange(24.0)

        args = _leaves(x, grad=(True,))
        expected = _eager_gradients(fn, *_leaves(x, grad=(True,)))
    else:

        def fn(x: th.Tensor, weight: th.Tensor, bias: th.Tensor) -> th.Tensor:  # type: ignore[misc]
            return F.layer_norm(x, [24], weight, bias)

        grad = (case != "input needs no gradient", True, True)
        args = _leaves(x, weight, bias, grad=grad)
        expected = _eager_gradients(fn, *_leaves(x, weight, bias, grad=grad))
    graph, traced = _traced_backward(fn, *args)
    assert not _uses_operator(graph)
    tolerance = {"atol": 0.05, "rtol": 0.05} if case == "bf16" else {}
    th.testing.assert_close(traced, expected, **tolerance)


def test_decomposition_table_pickles_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """inductor pickles the table into its caches' keys: it pickles as the call that makes it (some of
    inductor's own entries are C++ functions, which cannot be pickled), and unpickles to the same table;
    the package's entries go in by name, so a graph compiled under other entries is keyed apart."""
    table = compiled_update.inductor_decompositions()
    pickled = pickle.dumps(table)
    restored = pickle.loads(pickled)
    assert restored.keys() == table.keys()
    assert restored[th.ops.aten.native_layer_norm_backward.default] is layer_norm._decomposed_backward
    assert restored[th.ops.sb3_amago.leaky_relu.default] is th.ops.sb3_amago.leaky_relu_kernel.default
    assert all(name.encode() in pickled for name in compiled_update.package_entry_names())
    monkeypatch.delitem(compiled_update.PACKAGE_DECOMPOSITIONS, th.ops.sb3_amago.leaky_relu.default)
    assert pickle.dumps(compiled_update.inductor_decompositions()) != pickled


def test_compile_update_uses_the_operator_on_the_cpu() -> None:
    """``compile_update`` compiles for the CPU with :class:`CpuInductor` (one backend per set of options),
    and inductor's code for a layer norm's backward calls the operator; inductor's cache can key it."""
    assert cpu_backend((("fallback_random", True),)) is cpu_backend((("fallback_random", True),))
    counters.clear()
    x, weight, bias = _leaves(*_inputs(), grad=(True, True, True))

    def fn(x: th.Tensor, weight: th.Tensor, bias: th.Tensor) -> th.Tensor:
        return F.layer_norm(x + 1.0, [24], weight, bias)

    compiled = th.compile(fn, dynamic=True, backend=CpuInductor({"fallback_random": True}))
    _, code = run_and_get_code(lambda: compiled(x, weight, bias).sum().backward())
    assert any("sb3_amago.layer_norm_backward" in source for source in code), "the backward does not call the operator"
    assert not counters["inductor"]["fxgraph_cache_bypass"], "inductor's cache could not key the compiled graphs"
    expected = _eager_gradients(fn, *_leaves(*_inputs(), grad=(True, True, True)))
    th.testing.assert_close((x.grad, weight.grad, bias.grad), expected)
    assert callable(compile_update(fn, th.device("cpu")))


def test_the_compiled_cpu_update_has_only_the_batchs_time_axis_dynamic() -> None:
    """One graph serves every window length; the batch size and the feature widths are compiled in (a
    batch of another size compiles once more)."""
    from sb3_amago.compiled_update import cpu_compiled
    from sb3_amago.type_aliases import TrajectoryBatch

    graphs: list[th.fx.GraphModule] = []

    def recording(gm: th.fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        graphs.append(gm)
        return gm.forward

    def fn(policy: None, batch: TrajectoryBatch, scale: float) -> th.Tensor:
        weighted = batch.observations["x"] * batch.rewards.unsqueeze(-1)  # (B, L, 3)
        return weighted.sum(1) * scale + batch.time_idx.sum()

    def batch_of(size: int, length: int) -> TrajectoryBatch:
        floats = th.ones(size, length)
        return TrajectoryBatch(
            {"x": th.ones(size, length, 3)}, floats, floats, floats, floats, floats, floats.long(), floats.bool()
        )

    update = cpu_compiled(fn, recording)
    for size, length in ((2, 5), (2, 7), (2, 11)):
        assert th.equal(update(None, batch_of(size, length), 2.0), fn(None, batch_of(size, length), 2.0))
    assert len(graphs) == 1
    update(None, batch_of(3, 5), 2.0)
    assert len(graphs) == 2
