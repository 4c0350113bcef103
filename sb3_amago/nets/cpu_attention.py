"""Causal attention on the CPU in fp32 with the package's own kernel (``cpu_attention.cpp``).

torch's CPU attention kernels are slow at this model's head width (16): the flash kernel runs its
per-block products on small BLAS calls (on an AMD EPYC, MKL's generic code path), and the math
backend writes and reads the whole ``(L, L)`` scores several times. The kernel here takes each
(batch, head) pair as one task across the threads and, within it, blocks of 32 queries whose
scores against every key they may see are computed whole (an exact softmax), vectorised along the
keys; the backward takes blocks of keys against every query block that sees them, so that a
pair's work stays in the first-level cache, and recomputes the probabilities from the saved
log-sum-exp. Its input is the Transformer's projection of queries, keys and values, read at its
strides, queries and keys turned by the rotary tables as they are read; it writes its output in
the layout the output projection reads and returns the projection's gradient whole, so no rotation
or copy runs outside it. Two threads of a Zen 4 EPYC, forward and backward at ``(8, 8, L, 16)``:
0.56 against 1.39 ms (torch's math backend, compiled) at 65 steps, 4.4 against 11.6 ms (torch's
flash kernel) at 257 (``benchmarks/cpu_attention.py``; ``docs/design.md``, "CPU attention").

The kernel is one of the package's C++ kernels for the CPU: :mod:`sb3_amago.nets.cpu_kernels` builds
and loads them, and its ``SB3_AMAGO_CPU_KERNELS`` chooses them or torch's operators. The loaded build
also registers the operator's gradient, its only one (``cpu_kernels.cpp``, ``CausalAttentionFunction``):
the inputs and both outputs saved, :func:`causal_attention_backward` of the output's gradient, none for
the log-sum-exp (saved for the backward, not trained through) or the rotary tables (functions of time
indices). In C++, an eager update's three attention gradients run without Python (1.01x the eager update
at L = 64 on one thread); traced, it records the same two operators. :func:`stack_projection`'s gradient
(the projection's gradient split into views) is the build's too, and a backward through
:func:`causal_attention_backward` is an error there, as torch.library makes it: none of the three enters
Python on the CPU.
"""

from typing import Any

import torch as th
from torch.utils.flop_counter import register_flop_formula, sdpa_flop_count

from sb3_amago.nets import cpu_kernels


@th.library.custom_op("sb3_amago::causal_attention", mutates_args=())
def causal_attention_with_lse(qkv: th.Tensor, cos: th.Tensor, sin: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    """Causal softmax attention of the projection ``qkv`` ``(B, L, 3, H, Dh)`` (fp32 on the CPU, any
    strides with ``Dh`` contiguous) of queries, keys and values, scaled by ``1 / sqrt(Dh)``, the
    queries and keys first turned by the rotary tables ``cos`` and ``sin``
    (:func:`~sb3_amago.nets.rotary.rotary_tables`, broadcastable to ``(B, H, L, Dh)``; both empty: no
    rotation): the output ``(B, H, L, Dh)``, laid out as ``(B, L, H, Dh)`` (so that merging its heads
    is a view), and each query's log-sum-exp of its scaled scores ``(B, H, L)``.

    Empty tables rather than ``None``: compiled (torch 2.13), inductor's Python wrapper leaves a
    ``None`` argument out of the call, and its C++ wrapper passes the dispatcher fewer values than
    the schema has where a defaulted one is left out, which crashes the process."""
    out, lse = cpu_kernels.kernels().attention_forward(qkv, cos, sin)
    return out, lse


@causal_attention_with_lse.register_fake
def _(qkv: th.Tensor, cos: th.Tensor, sin: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    batch, length, _, heads, width = qkv.shape
    out = qkv.new_empty(batch, length, heads, width).transpose(1, 2)
    return out, qkv.new_empty(batch, heads, length)


@th.library.custom_op("sb3_amago::causal_attention_backward", mutates_args=())
def causal_attention_backward(
    grad: th.Tensor, qkv: th.Tensor, cos: th.Tensor, sin: th.Tensor, out: th.Tensor, lse: th.Tensor
) -> th.Tensor:
    """The gradient of :func:`causal_attention_with_lse`'s output with respect to the projection
    ``qkv`` as given (before the rotation of its queries and keys): ``(B, L, 3, H, Dh)``, contiguous,
    the layout of the product that made it, so no stack of three gradients and no copy follow."""
    return cpu_kernels.kernels().attention_backward(grad, qkv, cos, sin, out, lse)


@causal_attention_backward.register_fake
def _(grad: th.Tensor, qkv: th.Tensor, cos: th.Tensor, sin: th.Tensor, out: th.Tensor, lse: th.Tensor) -> th.Tensor:
    return qkv.new_empty(qkv.shape)


def projection_attention(qkv: th.Tensor, rotary: tuple[th.Tensor, th.Tensor] | None = None) -> th.Tensor:
    """Causal softmax attention with the kernel (loaded by :func:`~sb3_amago.nets.cpu_kernels.load`)
    over the projection ``qkv`` ``(B, L, 3, H, Dh)`` -> ``(B, H, L, Dh)``, queries and keys turned by
    the ``rotary`` tables ``(cos, sin)`` where given."""
    cos, sin = (qkv.new_empty(0), qkv.new_empty(0)) if rotary is None else rotary
    return causal_attention_with_lse(qkv, cos, sin)[0]


@th.library.custom_op("sb3_amago::stack_projection", mutates_args=())
def stack_projection(q: th.Tensor, k: th.Tensor, v: th.Tensor) -> th.Tensor:
    """Queries, keys and values ``(B, H, L, Dh)`` each stacked into a projection ``(B, L, 3, H, Dh)``,
    contiguous: a copy, one operator that ``torch.compile`` leaves as it is. Traced, torch 2.13's
    inductor made wrong code for the stack on one thread (a projection of garbage for the kernel
    under ``ATEN_CPU_CAPABILITY=avx2`` on an AVX-512 CPU, and heap corruption for a stack, a permute
    and a product with dynamic shapes: ``docs/design.md``, "CPU attention")."""
    return th.stack([q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)], dim=2)


@stack_projection.register_fake
def _(q: th.Tensor, k: th.Tensor, v: th.Tensor) -> th.Tensor:
    batch, heads, length, width = q.shape
    return q.new_empty(batch, length, 3, heads, width)


def causal_attention(q: th.Tensor, k: th.Tensor, v: th.Tensor, rotary: tuple[th.Tensor, th.Tensor] | None = None) -> th.Tensor:
    """:func:`projection_attention` of queries, keys and values apart, ``(B, H, L, Dh)`` each (the
    Transformer's path under bf16 autocast, whose queries and keys are turned before): stacked into a
    projection's layout first (:func:`stack_projection`, a copy)."""
    return projection_attention(stack_projection(q, k, v), rotary)


def attention_flops(q_shape: th.Size, k_shape: th.Size, v_shape: th.Size, *args: Any, **kwargs: Any) -> int:
    """FLOPs of a causal attention forward as torch counts attention: the scores and their product
    with the values, the ``(L, L)`` products whole. For this kernel's operator and for torch's CPU
    flash kernel, which ``FlopCounterMode`` lacks (``benchmarks/bench_updates.py``)."""
    return sdpa_flop_count(q_shape, k_shape, v_shape)


def attention_backward_flops(
    grad_shape: th.Size, q_shape: th.Size, k_shape: th.Size, v_shape: th.Size, *args: Any, **kwargs: Any
) -> int:
    """The backward's four products of the gradients, as torch counts them (the scores computed
    again are not counted)."""
    return 2 * sdpa_flop_count(q_shape, k_shape, v_shape)


def _heads_shape(qkv_shape: th.Size) -> th.Size:
    """The queries' shape ``(B, H, L, Dh)`` of a projection's ``(B, L, 3, H, Dh)``."""
    batch, length, _, heads, width = qkv_shape
    return th.Size((batch, heads, length, width))


def projection_attention_flops(qkv_shape: th.Size, *args: Any, **kwargs: Any) -> int:
    """:func:`attention_flops` of the kernel's operator, whose input is the projection."""
    shape = _heads_shape(qkv_shape)
    return attention_flops(shape, shape, shape)


def projection_attention_backward_flops(grad_shape: th.Size, qkv_shape: th.Size, *args: Any, **kwargs: Any) -> int:
    """:func:`attention_backward_flops` of the kernel's backward operator."""
    shape = _heads_shape(qkv_shape)
    return attention_backward_flops(grad_shape, shape, shape, shape)


register_flop_formula(th.ops.sb3_amago.causal_attention)(projection_attention_flops)
register_flop_formula(th.ops.sb3_amago.causal_attention_backward)(projection_attention_backward_flops)
