"""Causal attention on the CPU in fp32 with the package's own kernel (``cpu_attention.cpp``).

torch's CPU attention kernels are slow at this model's head width (16): the flash kernel runs its
per-block products on small BLAS calls (on an AMD EPYC, MKL's generic code path), and the math
backend writes and reads the whole ``(L, L)`` scores several times. The kernel here takes each
(batch, head) pair as one task across the threads and, within it, blocks of 32 queries whose
scores against every key they may see are computed whole (an exact softmax), vectorised along the
keys; the backward recomputes them from the saved log-sum-exp. It reads its inputs at their strides
and turns queries and keys by the rotary tables as it reads them, so the Transformer hands it the
views of its projection and no rotation or copy runs outside it. Two threads of a Zen 4 EPYC, forward
and backward at ``(8, 8, L, 16)``: 0.56 against 1.39 ms (torch's math backend, compiled) at 65
steps, 4.4 against 11.6 ms (torch's flash kernel) at 257 (``benchmarks/cpu_attention.py``;
``docs/design.md``, "CPU attention").

The kernel is one of the package's C++ kernels for the CPU: :mod:`sb3_amago.nets.cpu_kernels` builds
and loads them, and its ``SB3_AMAGO_CPU_KERNELS`` chooses them or torch's operators.
"""

from typing import Any

import torch as th
from torch.utils.flop_counter import register_flop_formula, sdpa_flop_count

from sb3_amago.nets import cpu_kernels


@th.library.custom_op("sb3_amago::causal_attention", mutates_args=())
def causal_attention_with_lse(
    q: th.Tensor, k: th.Tensor, v: th.Tensor, cos: th.Tensor, sin: th.Tensor
) -> tuple[th.Tensor, th.Tensor]:
    """Causal softmax attention of fp32 CPU tensors ``(..., L, Dh)`` each (any strides), scaled by
    ``1 / sqrt(Dh)``, the queries and keys first turned by the rotary tables ``cos`` and ``sin``
    (:func:`~sb3_amago.nets.rotary.rotary_tables`, broadcastable to the queries' shape; both empty:
    no rotation): the output ``(..., L, Dh)`` and each query's log-sum-exp of its scaled scores
    ``(..., L)``.

    Empty tables rather than ``None``: compiled (torch 2.13), inductor's Python wrapper leaves a
    ``None`` argument out of the call, and its C++ wrapper passes the dispatcher fewer values than
    the schema has where a defaulted one is left out, which crashes the process."""
    out, lse = cpu_kernels.kernels().attention_forward(q, k, v, cos, sin)
    return out, lse


@causal_attention_with_lse.register_fake
def _(q: th.Tensor, k: th.Tensor, v: th.Tensor, cos: th.Tensor, sin: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1])


@th.library.custom_op("sb3_amago::causal_attention_backward", mutates_args=())
def causal_attention_backward(
    grad: th.Tensor, q: th.Tensor, k: th.Tensor, v: th.Tensor, cos: th.Tensor, sin: th.Tensor, out: th.Tensor, lse: th.Tensor
) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
    """The gradients of :func:`causal_attention_with_lse`'s output with respect to ``q``, ``k`` and ``v``
    as given (before their rotation)."""
    dq, dk, dv = cpu_kernels.kernels().attention_backward(grad, q, k, v, cos, sin, out, lse)
    return dq, dk, dv


@causal_attention_backward.register_fake
def _(
    grad: th.Tensor, q: th.Tensor, k: th.Tensor, v: th.Tensor, cos: th.Tensor, sin: th.Tensor, out: th.Tensor, lse: th.Tensor
) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
    return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape)


def _setup_context(ctx: Any, inputs: tuple[th.Tensor, ...], output: tuple[th.Tensor, th.Tensor]) -> None:
    ctx.save_for_backward(*inputs, *output)


def _backward(ctx: Any, grad: th.Tensor, grad_lse: th.Tensor | None) -> tuple[th.Tensor, th.Tensor, th.Tensor, None, None]:
    # The log-sum-exp is saved for the backward, not trained through: its gradient is never used;
    # the rotary tables are functions of time indices, with no gradient either.
    return (*causal_attention_backward(grad, *ctx.saved_tensors), None, None)


causal_attention_with_lse.register_autograd(_backward, setup_context=_setup_context)


def causal_attention(q: th.Tensor, k: th.Tensor, v: th.Tensor, rotary: tuple[th.Tensor, th.Tensor] | None = None) -> th.Tensor:
    """Causal softmax attention with the kernel (loaded by :func:`~sb3_amago.nets.cpu_kernels.load`): ``(..., L, Dh)`` each ->
    ``(..., L, Dh)``, queries and keys turned by the ``rotary`` tables ``(cos, sin)`` where given."""
    cos, sin = (q.new_empty(0), q.new_empty(0)) if rotary is None else rotary
    return causal_attention_with_lse(q, k, v, cos, sin)[0]


def attention_flops(q_shape: th.Size, k_shape: th.Size, v_shape: th.Size, *args: Any, **kwargs: Any) -> int:
    """FLOPs of a causal attention forward as torch counts attention: the scores and their product
    with the values, the ``(L, L)`` products whole. For this kernel's operator, and for torch's CPU
    flash kernel, which ``FlopCounterMode`` lacks (``benchmarks/bench_updates.py``)."""
    return sdpa_flop_count(q_shape, k_shape, v_shape)


def attention_backward_flops(
    grad_shape: th.Size, q_shape: th.Size, k_shape: th.Size, v_shape: th.Size, *args: Any, **kwargs: Any
) -> int:
    """The backward's four products of the gradients, as torch counts them (the scores computed
    again are not counted)."""
    return 2 * sdpa_flop_count(q_shape, k_shape, v_shape)


register_flop_formula(th.ops.sb3_amago.causal_attention)(attention_flops)
register_flop_formula(th.ops.sb3_amago.causal_attention_backward)(attention_backward_flops)
