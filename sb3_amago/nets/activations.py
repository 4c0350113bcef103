"""Leaky ReLU (and ReLU, its slope 0) whose forward ``torch.compile`` keeps as an opaque operator on the CPU.

Compiled, a rectifier's backward needs only the sign of its input, and the compiler saves that as a
bool tensor for the backward pass. Inductor's CPU code stores bool (and other one-byte) tensors
about 50 times slower than float ones (a ``(520, 512)`` comparison: 1.3 ms against 26 us on an
Intel Xeon, torch 2.13), so each rectifier of a compiled update cost more than an eager layer's
whole forward. Under compile on the CPU these functions call the operator ``sb3_amago::leaky_relu``
instead, whose backward reads the layer's output (its sign is the input's, the slope being
non-negative): every rectifier of the package feeds a product or a norm that saves that output
anyway, so nothing more is stored, and the backward is plain torch code that the compiler fuses into
its neighbours. Inputs that need no gradient, eager code and other devices call ``F.leaky_relu``
(``F.relu`` at slope 0) directly. Where the package's CPU kernels are built, the operator's CPU
kernel is C++ (:mod:`sb3_amago.nets.cpu_kernels`), so compiled code calls it without entering
Python. :func:`linear_leaky_relu` runs a linear layer and its rectifier as one, the rectifier in
place on the product's output.

Both operators' gradients are Python formulas (``register_autograd``), which the compiler traces into
the backward graph. What compiled code then calls at run time needs no gradient, yet through these
operators every call would enter torch.library's Python autograd wrapper. So each has a twin without
autograd, ``sb3_amago::leaky_relu_kernel`` and ``sb3_amago::linear_leaky_relu_kernel``, the same
kernel (C++ with the package's build, whose autograd entry is then C++ too), and the package's
compiled update maps each operator to its twin once it is traced (:data:`RUN_TIME_OPERATORS`, in
:func:`sb3_amago.compiled_update.inductor_decompositions`): the formula stays in one place, and the
compiled update's forward calls no Python.
"""

import math
from typing import Any

import torch as th
from torch import nn
from torch.nn import functional as F
from torch.utils.flop_counter import register_flop_formula

from sb3_amago.nets import cpu_matmul

_LIBRARY = th.library.Library("sb3_amago", "FRAGMENT")
_LIBRARY.define("leaky_relu_kernel(Tensor x, float negative_slope) -> Tensor")
_LIBRARY.define(
    "linear_leaky_relu_kernel(Tensor x, Tensor weight, Tensor? bias, float negative_slope, bool ensemble) -> Tensor"
)


def _leaky_relu_kernel(x: th.Tensor, negative_slope: float) -> th.Tensor:
    """``F.leaky_relu``: the kernel of ``sb3_amago::leaky_relu`` and of its twin without autograd."""
    return F.leaky_relu(x, negative_slope)


def _product(x: th.Tensor, weight: th.Tensor, bias: th.Tensor | None, ensemble: bool) -> th.Tensor:
    """A linear layer's product as the package's layers compute it (:mod:`sb3_amago.nets.cpu_matmul`):
    ``linear`` (``weight (o, i)``), or with ``ensemble`` the ``C`` layers' ``ensemble_linear``
    (``x (C, N, i)``, ``weight (C, i, o)``, ``bias (C, 1, o)``)."""
    return cpu_matmul.ensemble_linear(x, weight, bias) if ensemble else cpu_matmul.linear(x, weight, bias)


def _linear_leaky_relu_kernel(
    x: th.Tensor, weight: th.Tensor, bias: th.Tensor | None, negative_slope: float, ensemble: bool
) -> th.Tensor:
    """The product without its bias, then the bias and the rectifier in place on its output: the kernel of
    ``sb3_amago::linear_leaky_relu`` and of its twin without autograd (the C++ kernel adds the bias and
    rectifies in one pass)."""
    product = _product(x, weight, None, ensemble)
    return F.leaky_relu(product if bias is None else product.add_(bias), negative_slope, inplace=True)


def _rectified_output(x: th.Tensor, negative_slope: float) -> th.Tensor:
    """The output of :func:`_leaky_relu_kernel` under fake tensors: ``x``'s shape."""
    return th.empty_like(x)


def _linear_output(
    x: th.Tensor, weight: th.Tensor, bias: th.Tensor | None, negative_slope: float, ensemble: bool
) -> th.Tensor:
    """The output of :func:`_linear_leaky_relu_kernel` under fake tensors: contiguous ``(..., o)``."""
    return x.new_empty(*x.shape[:-1], weight.shape[-1] if ensemble else weight.shape[0])


# Python kernels for every device; the package's build registers C++ ones on the CPU (cpu_kernels.cpp).
_LIBRARY.impl("leaky_relu_kernel", _leaky_relu_kernel, "CompositeExplicitAutograd")
_LIBRARY.impl("linear_leaky_relu_kernel", _linear_leaky_relu_kernel, "CompositeExplicitAutograd")
th.library.register_fake("sb3_amago::leaky_relu_kernel")(_rectified_output)
th.library.register_fake("sb3_amago::linear_leaky_relu_kernel")(_linear_output)


@th.library.custom_op("sb3_amago::leaky_relu", mutates_args=())
def compiled_leaky_relu(x: th.Tensor, negative_slope: float) -> th.Tensor:
    """``F.leaky_relu`` as one operator for ``torch.compile``."""
    return _leaky_relu_kernel(x, negative_slope)


compiled_leaky_relu.register_fake(_rectified_output)


def _setup_context(ctx: Any, inputs: tuple[th.Tensor, float], output: th.Tensor) -> None:
    ctx.save_for_backward(output)
    ctx.negative_slope = inputs[1]


def _backward(ctx: Any, grad: th.Tensor) -> tuple[th.Tensor, None]:
    (result,) = ctx.saved_tensors
    # Traced by the compiler (not opaque): fused into the kernels around it.
    return th.where(result > 0, grad, grad * ctx.negative_slope), None


compiled_leaky_relu.register_autograd(_backward, setup_context=_setup_context)


def leaky_relu(x: th.Tensor, negative_slope: float = 0.01) -> th.Tensor:
    """``F.leaky_relu(x, negative_slope)``; the opaque operator while compiling for the CPU where a
    backward pass will read it (``x`` needs a gradient, grad mode on). Without one (the target heads, under
    ``no_grad``) nothing is saved, so the compiler fuses the plain rectifier into its neighbours
    (a target critic ensemble's forward at L = 256, compiled, 12.0-12.4 ms against 13.1-13.7).

    :param negative_slope: must be >= 0 (the backward reads the sign of the output)
    """
    if x.device.type == "cpu" and th.compiler.is_compiling() and x.requires_grad and th.is_grad_enabled():
        return compiled_leaky_relu(x, negative_slope)
    return F.relu(x) if negative_slope == 0.0 else F.leaky_relu(x, negative_slope)


@th.library.custom_op("sb3_amago::linear_leaky_relu", mutates_args=())
def compiled_linear_leaky_relu(
    x: th.Tensor, weight: th.Tensor, bias: th.Tensor | None, negative_slope: float, ensemble: bool
) -> th.Tensor:
    """:func:`linear_leaky_relu` as one operator for ``torch.compile``: the bias is added and the
    rectifier runs in place on the product's output (a fresh tensor), so no second tensor of the
    layer's size is written (the C++ kernel does both in one pass)."""
    return _linear_leaky_relu_kernel(x, weight, bias, negative_slope, ensemble)


compiled_linear_leaky_relu.register_fake(_linear_output)


def _linear_setup_context(ctx: Any, inputs: tuple[Any, ...], output: th.Tensor) -> None:
    x, weight, bias, negative_slope, ensemble = inputs
    ctx.save_for_backward(x, weight, output)
    ctx.negative_slope, ctx.ensemble, ctx.has_bias = negative_slope, ensemble, bias is not None


def _linear_backward(ctx: Any, grad: th.Tensor) -> tuple[th.Tensor | None, ...]:
    # Traced by the compiler: the products and sums that autograd's own backward of the layer and
    # its rectifier would run, in the same orientation, so the gradients are theirs bit for bit.
    x, weight, result = ctx.saved_tensors
    need_x, need_weight, need_bias, _, _ = ctx.needs_input_grad
    grad = th.where(result > 0, grad, grad * ctx.negative_slope)  # the rectifier's input's gradient
    grad_x = grad_weight = grad_bias = None
    if ctx.ensemble:  # (C, N, o) against x (C, N, i) and weight (C, i, o)
        grad_x = grad.bmm(weight.transpose(1, 2)) if need_x else None
        grad_weight = x.transpose(1, 2).bmm(grad) if need_weight else None
        grad_bias = grad.sum(1, keepdim=True) if ctx.has_bias and need_bias else None
        return grad_x, grad_weight, grad_bias, None, None
    grad_2d, x_2d = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])  # (N, o), (N, i)
    grad_x = grad_2d.mm(weight).view(x.shape) if need_x else None
    grad_weight = x_2d.t().mm(grad_2d).t() if need_weight else None
    grad_bias = grad_2d.sum(0) if ctx.has_bias and need_bias else None
    return grad_x, grad_weight, grad_bias, None, None


compiled_linear_leaky_relu.register_autograd(_linear_backward, setup_context=_linear_setup_context)


@register_flop_formula([th.ops.sb3_amago.linear_leaky_relu, th.ops.sb3_amago.linear_leaky_relu_kernel])
def _linear_flops(x_shape: th.Size, weight_shape: th.Size, bias_shape: Any, negative_slope: float, ensemble: bool) -> int:
    """What ``FlopCounterMode`` counts for the operator: its product's ``2 N i o``."""
    return 2 * math.prod(x_shape) * (weight_shape[-1] if ensemble else weight_shape[0])


#: Each operator with a gradient formula, and its twin without autograd that compiled code calls once traced.
RUN_TIME_OPERATORS = {
    th.ops.sb3_amago.leaky_relu.default: th.ops.sb3_amago.leaky_relu_kernel.default,
    th.ops.sb3_amago.linear_leaky_relu.default: th.ops.sb3_amago.linear_leaky_relu_kernel.default,
}


def linear_leaky_relu(
    x: th.Tensor, weight: th.Tensor, bias: th.Tensor | None, negative_slope: float = 0.01, ensemble: bool = False
) -> th.Tensor:
    """``leaky_relu(linear(x, weight, bias), negative_slope)`` with the rectifier in place on the
    product's output: a layer of ``C`` ensemble members' critics writes one ``(C, N, o)`` tensor, not
    two (on a CPU, the second was written to memory the caches no longer held: the critics' first
    layer at L = 64, 1.19 against 0.84 ms with the caches flushed before it). Eager this is
    ``F.leaky_relu(..., inplace=True)``, whose backward reads the output as :func:`leaky_relu`'s does;
    compiling for the CPU where a backward pass will read it, the operator
    ``sb3_amago::linear_leaky_relu`` (the compiler would make the in-place rectifier a copy). Compiled
    on the CPU the bias is added with the rectifier, in one pass over the product's output (the
    operator's C++ kernel; traced and fused where nothing needs a gradient), not copied into the whole
    output before the product as ``addmm`` and ``baddbmm`` do: 1.009-1.014x the compiled update at
    L = 64 on an Intel Xeon. The same values eager and compiled where MKL adds the bias to the
    finished product (inner sizes up to 256 on that Xeon: the heads' at the reference widths), at
    rounding level apart otherwise.

    :param ensemble: ``x (C, N, i)``, ``weight (C, i, o)``, ``bias (C, 1, o)`` (``baddbmm``), else
        ``weight (o, i)``, ``bias (o,)`` (``F.linear``)
    :param negative_slope: must be >= 0
    """
    if cpu_matmul.routed(x, weight):  # oneDNN's products, then the rectifier
        return leaky_relu(_product(x, weight, bias, ensemble), negative_slope)
    if not th.compiler.is_compiling():
        return F.leaky_relu(_product(x, weight, bias, ensemble), negative_slope, inplace=True)
    if x.device.type != "cpu" or th.is_autocast_enabled("cpu"):  # the bias in the product, cast with it
        return leaky_relu(_product(x, weight, bias, ensemble), negative_slope)
    if th.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return compiled_linear_leaky_relu(x, weight, bias, negative_slope, ensemble)
    product = _product(x, weight, None, ensemble)  # traced: the bias added in the rectifier's kernel
    return leaky_relu(product if bias is None else product + bias, negative_slope)


class LeakyReLU(nn.Module):
    """The module of :func:`leaky_relu` (``nn.LeakyReLU`` without ``inplace``); ``negative_slope=0``
    is a ReLU."""

    def __init__(self, negative_slope: float = 0.01) -> None:
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: th.Tensor) -> th.Tensor:
        return leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"
