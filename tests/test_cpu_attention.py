"""The package's CPU attention kernel (sb3_amago/nets/cpu_attention.py): causal softmax attention's
values and gradients, compiled as eager, used by the Transformer's training pass where it is built,
and the setting and fallbacks around its build."""

import functools
from typing import Any

import pytest
import torch as th
from op_log import OpLog
from torch.nn import functional as F

from sb3_amago.nets import cpu_attention, cpu_kernels, make_traj_encoder
from sb3_amago.nets.rotary import apply_rotary, rotary_tables
from sb3_amago.nets.transformer import causal_attention

needs_kernel = pytest.mark.skipif(
    not cpu_kernels.buildable(), reason="the kernel is built for x86 CPUs with AVX2 or AVX-512 only"
)


@pytest.fixture(scope="module")
def kernel() -> None:
    assert cpu_kernels.load()


def reference(q: th.Tensor, k: th.Tensor, v: th.Tensor, grad: th.Tensor) -> list[th.Tensor]:
    """torch's causal attention in float64: the output and the gradients of q, k and v."""
    inputs = [x.double().detach().requires_grad_() for x in (q, k, v)]
    out = F.scaled_dot_product_attention(*inputs, is_causal=True)
    out.backward(grad.double())
    return [out.detach(), *(x.grad for x in inputs)]


def kernel_run(
    q: th.Tensor, k: th.Tensor, v: th.Tensor, grad: th.Tensor, fn: Any = cpu_attention.causal_attention
) -> list[th.Tensor]:
    inputs = [x.detach().requires_grad_() for x in (q, k, v)]
    out = fn(*inputs)
    out.backward(grad)
    return [out.detach(), *(x.grad for x in inputs)]


@needs_kernel
@pytest.mark.parametrize(
    "shape",
    [(2, 3, 1, 16), (2, 2, 17, 8), (1, 2, 65, 16), (2, 1, 130, 24), (1, 1, 40, 64), (1, 3, 33, 5)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_values_and_gradients_are_causal_softmax_attention(kernel: None, shape: tuple[int, ...]) -> None:
    # Lengths across query blocks (32 rows) and vector widths, head widths that are not a multiple of
    # the vector's: as close to float64 attention as torch's own fp32 kernels are (errors ~1e-6).
    gen = th.Generator().manual_seed(len(shape) + shape[2])
    q, k, v, grad = (th.randn(*shape, generator=gen) for _ in range(4))
    for got, expected in zip(kernel_run(q, k, v, grad), reference(q, k, v, grad)):
        th.testing.assert_close(got.double(), expected, atol=2e-5, rtol=1e-4)


@needs_kernel
def test_strided_inputs_give_the_contiguous_inputs_values(kernel: None) -> None:
    # A projection at other strides (here its batch and time axes swapped in memory), and an output
    # gradient at other strides than the output's, give the values of contiguous ones; the output is
    # laid out (B, L, H, Dh), so merging its heads is a view, and the projection's gradient is whole.
    gen = th.Generator().manual_seed(1)
    qkv = th.randn(21, 2, 3, 4, 16, generator=gen).transpose(0, 1)  # (B, L, 3, H, Dh), strided
    grad = th.randn(2, 4, 21, 16, generator=gen)
    strided = projection_run(qkv, grad)
    contiguous = projection_run(qkv.contiguous(), grad.transpose(1, 2).contiguous().transpose(1, 2))
    assert all(th.equal(a, b) for a, b in zip(strided, contiguous))
    none = qkv.new_empty(0)
    out, lse = cpu_attention.causal_attention_with_lse(qkv, none, none)
    assert out.transpose(1, 2).is_contiguous()
    grad_qkv = cpu_attention.causal_attention_backward(grad, qkv, none, none, out, lse)
    assert grad_qkv.is_contiguous() and th.equal(grad_qkv, strided[1])


def projection_run(qkv: th.Tensor, grad: th.Tensor, fn: Any = cpu_attention.projection_attention) -> list[th.Tensor]:
    """The kernel's output over the projection ``qkv`` ``(B, L, 3, H, Dh)`` and the projection's gradient."""
    x = qkv.detach().requires_grad_()
    out = fn(x)
    out.backward(grad)
    return [out.detach(), x.grad]


def _projection(batch: int, length: int, heads: int, width: int, seed: int) -> th.Tensor:
    """A projection of queries, keys and values ``(B, L, 3, H, Dh)``, as the Transformer's."""
    gen = th.Generator().manual_seed(seed)
    return th.randn(batch, length, 3, heads, width, generator=gen)


def _heads(qkv: th.Tensor) -> th.Tensor:
    return qkv.permute(2, 0, 3, 1, 4)  # (3, B, H, L, Dh)


@needs_kernel
@pytest.mark.parametrize("shape", [(2, 3, 37, 16), (1, 2, 65, 8), (2, 1, 5, 24)], ids=lambda s: "x".join(map(str, s)))
def test_rotary_tables_turn_queries_and_keys_inside_the_kernel(kernel: None, shape: tuple[int, int, int, int]) -> None:
    # The values and gradients of rotating with torch's operators and then attending, bit for bit
    # (the kernel rounds the rotation's products as torch does), and close to float64.
    batch, heads, length, width = shape
    qkv = _projection(batch, length, heads, width, seed=length)
    rotary = rotary_tables(th.randint(0, 1000, (batch, length), generator=th.Generator().manual_seed(1)), width)
    grad = th.randn(batch, heads, length, width, generator=th.Generator().manual_seed(2))

    def inside(x: th.Tensor) -> th.Tensor:
        return cpu_attention.projection_attention(x, rotary)

    def rotated_first(x: th.Tensor) -> th.Tensor:
        q, k = apply_rotary(_heads(x)[:2], rotary).unbind(0)
        return cpu_attention.causal_attention(q, k, _heads(x)[2])

    def float64(x: th.Tensor) -> th.Tensor:
        q, k = apply_rotary(_heads(x)[:2], tuple(t.double() for t in rotary)).unbind(0)
        return F.scaled_dot_product_attention(q, k, _heads(x)[2], is_causal=True)

    got = projection_run(qkv, grad, inside)
    assert all(th.equal(a, b) for a, b in zip(got, projection_run(qkv, grad, rotated_first)))
    for a, b in zip(got, projection_run(qkv.double(), grad.double(), float64)):
        th.testing.assert_close(a.double(), b, atol=2e-5, rtol=1e-4)


@needs_kernel
def test_rotary_tables_are_checked(kernel: None) -> None:
    qkv = _projection(1, 4, 2, 16, seed=0)
    cos, sin = rotary_tables(th.arange(4).unsqueeze(0), 16)
    with pytest.raises(RuntimeError, match="give both rotary tables"):
        cpu_attention.causal_attention_with_lse(qkv, cos, sin[:0])
    odd = _projection(1, 4, 2, 5, seed=0)
    with pytest.raises(RuntimeError, match="even head width"):
        cpu_attention.projection_attention(odd, (th.ones(1, 1, 4, 5), th.zeros(1, 1, 4, 5)))
    with pytest.raises(RuntimeError, match=r"\(B, L, 3, H, D\) projection"):
        cpu_attention.causal_attention_with_lse(qkv[:, :, :2], cos, sin)


@needs_kernel
@pytest.mark.parametrize("cpp_wrapper", [False, True], ids=["python_wrapper", "cpp_wrapper"])
def test_compiled_calls_take_the_eager_values_at_every_length(kernel: None, cpp_wrapper: bool) -> None:
    # With and without rotary tables; AMAGO compiles CPU updates with inductor's C++ wrapper, which
    # calls the operator through the dispatcher with every argument of its schema.
    # The compiled graph's buffers follow the fake operators' layouts, which must be the kernel's.
    options = {"cpp_wrapper": cpp_wrapper}
    compiled = th.compile(cpu_attention.projection_attention, dynamic=True, fullgraph=True, options=options)
    apart = th.compile(cpu_attention.causal_attention, dynamic=True, fullgraph=True, options=options)
    for length in (9, 40):  # one graph for both (dynamic shapes)
        gen = th.Generator().manual_seed(length)
        qkv, grad = th.randn(2, length, 3, 2, 16, generator=gen), th.randn(2, 2, length, 16, generator=gen)
        eager, traced = projection_run(qkv, grad), projection_run(qkv, grad, compiled)
        assert all(th.equal(a, b) for a, b in zip(eager, traced))
        q, k, v = _heads(qkv).unbind(0)
        assert all(th.equal(a, b) for a, b in zip(kernel_run(q, k, v, grad), kernel_run(q, k, v, grad, fn=apart)))
        rotary = rotary_tables(th.arange(length).repeat(2, 1), 16)
        eager = projection_run(qkv, grad, functools.partial(cpu_attention.projection_attention, rotary=rotary))
        traced = projection_run(qkv, grad, functools.partial(compiled, rotary=rotary))
        assert all(th.equal(a, b) for a, b in zip(eager, traced))


@needs_kernel
def test_queries_keys_and_values_apart_are_stacked_by_one_opaque_operator(kernel: None) -> None:
    # The bf16 path's stack into a projection (its gradient is the build's): its values and gradients
    # are the stack's, eager and compiled, and the compiled graph keeps it as one operator (inductor's
    # own code for that stack was wrong on one thread in torch 2.13).
    gen = th.Generator().manual_seed(3)
    q, k, v = (th.randn(2, 3, 9, 16, generator=gen) for _ in range(3))
    weights = th.randn(2, 9, 3, 3, 16, generator=gen)

    def run(fn: Any) -> list[th.Tensor]:
        inputs = [x.clone().requires_grad_() for x in (q, k, v)]
        out = fn(*inputs)
        (out * weights).sum().backward()
        return [out.detach(), *(x.grad for x in inputs)]

    expected = run(lambda a, b, c: th.stack([a, b, c]).permute(1, 3, 0, 2, 4))
    compiled = th.compile(cpu_attention.stack_projection, dynamic=True, fullgraph=True)
    for fn in (cpu_attention.stack_projection, compiled):
        got = run(fn)
        assert got[0].is_contiguous() and all(th.equal(a, b) for a, b in zip(got, expected))
    graphs: list[str] = []
    th._dynamo.reset()
    th.compile(cpu_attention.stack_projection, backend=lambda gm, _: graphs.append(str(gm.graph)) or gm)(q, k, v)
    assert "sb3_amago.stack_projection" in graphs[0] and "torch.stack" not in graphs[0]


@needs_kernel
def test_the_transformers_training_pass_runs_the_kernel_forward_and_backward(kernel: None) -> None:
    encoder = make_traj_encoder("transformer", 5, 6, n_layers=2, d_model=16, n_heads=2, d_ff=16).train()
    x, time_idx = th.randn(2, 6, 5), th.arange(6).repeat(2, 1)
    with OpLog() as ops:
        encoder(x, time_idx, th.ones(2, 6, dtype=th.bool)).sum().backward()
    assert ops.names.count("sb3_amago.causal_attention.default") == 2  # one per layer
    assert ops.names.count("sb3_amago.causal_attention_backward.default") == 2
    assert not [name for name in ops.names if "scaled_dot_product" in name or name == "aten.bmm.default"]
    # The rotary tables (non-empty) go into the kernel, which turns queries and keys itself.
    assert all(args[1].numel() > 0 for name, args in ops.calls if name == "sb3_amago.causal_attention.default")


@needs_kernel
def test_the_eager_gradient_is_the_builds_and_gives_none_to_the_log_sum_exp_and_tables(kernel: None) -> None:
    # The build registers the operator's autograd in C++ (no Python in an eager backward).
    qkv = _projection(2, 7, 2, 16, seed=3).requires_grad_()
    cos, sin = (table.requires_grad_() for table in rotary_tables(th.arange(7).repeat(2, 1), 16))
    out, lse = cpu_attention.causal_attention_with_lse(qkv, cos, sin)
    assert "CausalAttentionFunction" in out.grad_fn.name() and lse.grad_fn is out.grad_fn
    (out.sum() + lse.sum()).backward()  # the log-sum-exp's gradient is not used
    grad = th.ones_like(out)
    expected = cpu_attention.causal_attention_backward(
        grad, qkv.detach(), cos.detach(), sin.detach(), out.detach(), lse.detach()
    )
    assert th.equal(qkv.grad, expected)
    assert cos.grad is None and sin.grad is None


def test_set_aside_the_training_pass_takes_torchs_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_kernels, "CHOICE", "torch")
    q, k, v = (th.randn(1, 2, 7, 16) for _ in range(3))
    with OpLog() as ops:
        out = causal_attention(q, k, v)
    assert not any("sb3_amago" in name for name in ops.names)
    th.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
