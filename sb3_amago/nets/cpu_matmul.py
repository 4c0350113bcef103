"""The networks' fp32 matrix products on oneDNN, on CPUs where torch's BLAS runs a slow code path.

torch's x86 builds send fp32 matrix products (``F.linear``, ``bmm``, ``baddbmm``) to MKL. On AMD
processors MKL runs a generic code path without AVX-512: on an AMD EPYC of the Zen 5 generation
(CPU family 26), whose cores execute 512-bit instructions at full width, two cores, a 2,048-cubed
fp32 product runs at about 210 GFLOP/s there and at 450-470 on oneDNN, the other matrix library
inside torch (the one autocast's bf16 products already use), and the reference update's own products
take 1.5-1.6x less time (``benchmarks/cpu_matmul.py``). On Zen 4 (family 25), which splits each
512-bit instruction in two 256-bit halves, AVX-512 gains nothing over MKL's path: the update's
products took as long on both libraries and the whole update ran 6-17% faster on MKL, whose calls
cost less. So :func:`linear`, :class:`Linear` and :func:`ensemble_linear` compute their products
with oneDNN where :data:`ONEDNN` says so, and call torch's own functions everywhere else: other
devices, other dtypes, under autocast (whose bf16 products are oneDNN's already), products too
small to gain (:data:`ONEDNN_MIN_MACS`), and CPUs where MKL is as fast.

The choice is made once per process, at import, from ``SB3_AMAGO_CPU_MATMUL``: ``auto`` (the
default) picks oneDNN on AMD x86 CPUs of family 26 or later on which torch runs AVX-512 code, and
torch's BLAS elsewhere; ``onednn`` and ``blas`` force one. Both compute in fp32 with fp32
accumulation; only the order of the sums differs.

Under ``torch.compile`` the product is the operator ``sb3_amago::onednn_linear``, opaque to the
compiler, whose backward runs on the same operator.
"""

import math
import os
from pathlib import Path
from typing import Any

import torch as th
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import register_flop_formula

#: Environment variable that chooses the fp32 matrix library on the CPU: auto, onednn or blas.
ENV_VARIABLE = "SB3_AMAGO_CPU_MATMUL"
CHOICES = ("auto", "onednn", "blas")


#: The first AMD CPU family whose cores run 512-bit instructions at full width (Zen 5).
FULL_WIDTH_AVX512_AMD_FAMILY = 26


def first_processor(cpuinfo: str) -> dict[str, str]:
    """The ``key: value`` fields of the first processor in ``cpuinfo``, the text of Linux's
    ``/proc/cpuinfo`` (one block per processor, blank-line separated)."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:
                break  # the blank line after the first processor
            continue
        fields.setdefault(key.strip(), value.strip())
    return fields


def amd_with_full_width_avx512(cpuinfo: str) -> bool:
    """Whether ``cpuinfo`` (the text of ``/proc/cpuinfo``) describes an AMD CPU of family
    :data:`FULL_WIDTH_AVX512_AMD_FAMILY` or later (its first processor's ``vendor_id`` and ``cpu family``)."""
    fields = first_processor(cpuinfo)
    family = fields.get("cpu family", "")
    return fields.get("vendor_id") == "AuthenticAMD" and family.isdigit() and int(family) >= FULL_WIDTH_AVX512_AMD_FAMILY


def _onednn_faster_here() -> bool:
    """Whether this CPU is one where oneDNN's fp32 products beat MKL's: torch dispatches AVX-512 code
    and :func:`amd_with_full_width_avx512` holds for ``/proc/cpuinfo`` (Linux only)."""
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.exists() or th.backends.cpu.get_cpu_capability() not in ("AVX512", "AMX"):
        return False
    return amd_with_full_width_avx512(cpuinfo.read_text())


def _onednn_available() -> bool:
    return th.backends.mkldnn.is_available() and hasattr(th.ops.mkldnn, "_linear_pointwise")


def onednn_matmul_chosen() -> bool:
    """Whether fp32 CPU products should run on oneDNN, from ``SB3_AMAGO_CPU_MATMUL`` and this CPU
    (read once, at import, into :data:`ONEDNN`)."""
    choice = os.environ.get(ENV_VARIABLE, "auto").strip().lower()
    if choice not in CHOICES:
        raise ValueError(
            f"{ENV_VARIABLE}={choice!r} is not one of {', '.join(CHOICES)}: set it to one of them, or unset it for auto"
        )
    if choice == "blas":
        return False
    if not _onednn_available():
        if choice == "onednn":
            raise RuntimeError(
                f"{ENV_VARIABLE}=onednn, but this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False): "
                "unset it, or set it to blas"
            )
        return False
    return choice == "onednn" or _onednn_faster_here()


#: This process's choice: fp32 CPU products on oneDNN. A constant to ``torch.compile`` (it guards on it).
ONEDNN = onednn_matmul_chosen()
#: Products of fewer multiply-adds (``N * i * o``) stay on torch's BLAS: a oneDNN call costs about
#: 11 us however small (MKL's about 2), more than it saves below 1-4 million (acting's products,
#: a batch of envs at a time, are of that size; AMD EPYC, one and two threads).
ONEDNN_MIN_MACS = 2**22


def routed(*tensors: th.Tensor) -> bool:
    """Whether a product of ``tensors`` goes to oneDNN: fp32 on the CPU, autocast off, oneDNN chosen."""
    return (
        all(t.device.type == "cpu" and t.dtype == th.float32 for t in tensors) and not th.is_autocast_enabled("cpu") and ONEDNN
    )


# Defined with torch.library's low-level API, not ``custom_op``: the latter's Python wrapper costs
# ~12 us more a call (compiled code calls the operator three times per product, backward included).
_LIBRARY = th.library.Library("sb3_amago", "FRAGMENT")
_LIBRARY.define("onednn_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor")


def _onednn_linear_cpu(x: th.Tensor, weight: th.Tensor, bias: th.Tensor | None) -> th.Tensor:
    """``x (..., i) @ weight (o, i).T + bias (o)`` by oneDNN, any strides (transposed views included);
    by torch's BLAS under :data:`ONEDNN_MIN_MACS` (and over an empty axis, which oneDNN refuses)."""
    if x.numel() * weight.shape[0] < max(ONEDNN_MIN_MACS, 1):
        return F.linear(x, weight, bias)
    return th.ops.mkldnn._linear_pointwise.default(x, weight, bias, "none", [], "")


_LIBRARY.impl("onednn_linear", _onednn_linear_cpu, "CPU")
#: The operator: :func:`_onednn_linear_cpu` on CPU tensors, opaque to ``torch.compile``.
onednn_linear = th.ops.sb3_amago.onednn_linear.default


@th.library.register_fake("sb3_amago::onednn_linear")
def _(x: th.Tensor, weight: th.Tensor, bias: th.Tensor | None) -> th.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _setup_context(ctx: Any, inputs: tuple[th.Tensor, th.Tensor, th.Tensor | None], output: th.Tensor) -> None:
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None


def _backward(ctx: Any, grad: th.Tensor) -> tuple[th.Tensor | None, th.Tensor | None, th.Tensor | None]:
    x, weight = ctx.saved_tensors
    need_x, need_weight, need_bias = ctx.needs_input_grad
    grad_2d, x_2d = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])  # (N, o), (N, i)
    grad_x = onednn_linear(grad, weight.t(), None) if need_x else None  # (..., o) @ (o, i)
    grad_weight = onednn_linear(grad_2d.t(), x_2d.t(), None) if need_weight else None  # (o, N) @ (N, i)
    grad_bias = grad_2d.sum(0) if ctx.has_bias and need_bias else None
    return grad_x, grad_weight, grad_bias


th.library.register_autograd("sb3_amago::onednn_linear", _backward, setup_context=_setup_context)


@register_flop_formula(th.ops.sb3_amago.onednn_linear)
def _flops(x_shape: th.Size, weight_shape: th.Size, *args: Any, **kwargs: Any) -> int:
    """What ``torch.utils.flop_counter.FlopCounterMode`` counts for the operator: ``2 N i o``."""
    return 2 * math.prod(x_shape) * weight_shape[0]


def _large(x: th.Tensor, out_features: int) -> bool:
    """Whether a product of ``x`` into ``out_features`` goes to the operator. Compiling, it always does
    (the operator picks the library by size at run time), so the graph holds no branch on a
    dynamic size; eager, a small product skips the operator's own call cost."""
    return th.compiler.is_compiling() or x.numel() * out_features >= ONEDNN_MIN_MACS


def linear(x: th.Tensor, weight: th.Tensor, bias: th.Tensor | None = None) -> th.Tensor:
    """``F.linear(x, weight, bias)``: ``(..., i)``, ``(o, i)``, ``(o,)`` -> ``(..., o)``."""
    if routed(x, weight) and _large(x, weight.shape[0]):
        return onednn_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def ensemble_linear(x: th.Tensor, weight: th.Tensor, bias: th.Tensor | None = None) -> th.Tensor:
    """``C`` linear layers at once, ``th.baddbmm(bias, x, weight)`` (``th.bmm`` without ``bias``):
    ``x (C, N, i)``, ``weight (C, i, o)``, ``bias (C, 1, o)`` -> ``(C, N, o)``. ``x`` may be one
    input expanded along ``C``: routed, that is one product with the members' weights side by side
    (its backward sums the members' input gradients inside the product), else one per member."""
    if not (routed(x, weight) and _large(x[0], weight.shape[-1])):
        return th.bmm(x, weight) if bias is None else th.baddbmm(bias, x, weight)
    n_members, _, out_features = weight.shape
    if x.stride(0) == 0:
        side_by_side = weight.transpose(1, 2).reshape(n_members * out_features, -1)  # (C * o, i)
        out = onednn_linear(x[0], side_by_side, None if bias is None else bias.reshape(-1))  # (N, C * o)
        return out.view(-1, n_members, out_features).transpose(0, 1).contiguous()
    if th.compiler.is_compiling():
        return th.stack([onednn_linear(x[c], weight[c].t(), None if bias is None else bias[c, 0]) for c in range(n_members)])
    # Eager, indexing a member's slice has a backward that fills a zero tensor of the whole
    # ensemble's shape per member and sums them (8 fills of (4, 512, 256) per reference update);
    # unbind's backward stacks the members' gradients once: the same values, +2.4% eager at L = 64.
    # Compiled, indexing is the faster one (inductor fuses the selects' backward; unbind: -10%).
    biases = [None] * n_members if bias is None else bias.squeeze(1).unbind(0)
    return th.stack([onednn_linear(xc, wc.t(), bc) for xc, wc, bc in zip(x.unbind(0), weight.unbind(0), biases, strict=True)])


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters, same state dict) whose product is :func:`linear`'s."""

    def forward(self, x: th.Tensor) -> th.Tensor:
        return linear(x, self.weight, self.bias)
