"""Leaky ReLU (and ReLU, its slope 0) whose forward ``torch.compile`` keeps as an opaque operator on the CPU.

Compiled, a rectifier's backward needs only the sign of its input, and the compiler saves that as a
bool tensor for the backward pass. Inductor's CPU code stores bool (and other one-byte) tensors
about 50 times slower than float ones (a ``(520, 512)`` comparison: 1.3 ms against 26 us on an
Intel Xeon, torch 2.13), so each rectifier of a compiled update cost more than an eager layer's
whole forward. Under compile on the CPU these functions call the operator ``sb3_amago::leaky_relu``
instead, whose backward reads the layer's output (its sign is the input's, the slope being
non-negative): every rectifier of the package feeds a product or a norm that saves that output
anyway, so nothing more is stored, and the backward is plain torch code that the compiler fuses into
its neighbours. Where the package's CPU kernels are built, the operator's CPU kernel is C++
(:mod:`sb3_amago.nets.cpu_kernels`), so compiled code calls it without entering Python. Inputs that need no gradient, eager code and other devices call ``F.leaky_relu``
(``F.relu`` at slope 0) directly.
"""

from typing import Any

import torch as th
from torch import nn
from torch.nn import functional as F


@th.library.custom_op("sb3_amago::leaky_relu", mutates_args=())
def compiled_leaky_relu(x: th.Tensor, negative_slope: float) -> th.Tensor:
    """``F.leaky_relu`` as one operator for ``torch.compile``."""
    return F.leaky_relu(x, negative_slope)


@compiled_leaky_relu.register_fake
def _(x: th.Tensor, negative_slope: float) -> th.Tensor:
    return th.empty_like(x)


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
