"""Sigma-reparameterised linear layers (Zhai et al. 2023, "Stabilizing Transformer Training by
Preventing Attention Entropy Collapse").

The weight is used as ``W_hat = g / sigma(W) * W`` where ``sigma(W)`` is the largest singular value
of ``W`` and ``g`` a learnable scalar. ``sigma`` is estimated by power iteration, one step per
training-mode forward, with the singular-vector estimates ``u`` and ``v`` kept as persistent float
buffers. In eval mode the vectors are frozen, so the layer is a fixed function of its parameters.
"""

import math

import torch as th
from torch import nn
from torch.nn import functional as F

from sb3_amago.nets.cpu_matmul import Linear, linear

# Power-iteration steps run once at construction so that ``sigma`` starts near its true value.
_INIT_POWER_STEPS = 30
_EPS = 1e-12


class SigmaReparamLinear(nn.Module):
    """Linear layer ``y = (g / sigma(W)) (x W^T) + b``.

    ``g`` is initialised to the initial estimate of ``sigma(W)``, so at initialisation (in eval mode)
    the layer computes exactly ``x W^T + b``.

    :param in_features: input size
    :param out_features: output size
    :param bias: whether to learn an additive bias
    """

    u: th.Tensor
    v: th.Tensor

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(th.empty(out_features, in_features))
        self.bias = nn.Parameter(th.zeros(out_features)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(in_features)
            nn.init.uniform_(self.bias, -bound, bound)
        self.register_buffer("u", F.normalize(th.randn(out_features), dim=0, eps=_EPS))
        self.register_buffer("v", F.normalize(th.randn(in_features), dim=0, eps=_EPS))
        with th.no_grad():
            for _ in range(_INIT_POWER_STEPS):
                self._power_step()
        self.gain = nn.Parameter(self.sigma().detach().clone())

    @th.no_grad()
    def _power_step(self) -> None:
        """One power-iteration step, updating ``u`` and ``v`` in place."""
        weight = self.weight.detach().to(self.u.dtype)  # (out, in)
        with _full_precision(weight):
            self.v.copy_(F.normalize(th.mv(weight.t(), self.u), dim=0, eps=_EPS))
            self.u.copy_(F.normalize(th.mv(weight, self.v), dim=0, eps=_EPS))

    def sigma(self) -> th.Tensor:
        """Current estimate of the largest singular value of ``W``, ``u^T W v`` (0-dim,
        differentiable in ``W``).

        The vectors are cloned so that a later power step, updating them in place, does not
        invalidate a graph built from this estimate. Here and in the power step, autocast is off, so
        that it never lowers their precision.
        """
        with _full_precision(self.weight):
            return th.dot(self.u.clone(), th.mv(self.weight.to(self.u.dtype), self.v.clone()))

    def forward(self, x: th.Tensor) -> th.Tensor:
        """:param x: ``(..., in_features)`` -> ``(..., out_features)``"""
        if self.training:
            self._power_step()
        scale = (self.gain / self.sigma()).to(self.weight.dtype)  # 0-dim
        return linear(x, self.weight * scale, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def _full_precision(tensor: th.Tensor) -> th.autocast:
    """A context in which autocast is off on ``tensor``'s device."""
    return th.autocast(device_type=tensor.device.type, enabled=False)


def make_linear(in_features: int, out_features: int, sigma_reparam: bool, bias: bool = True) -> nn.Module:
    """A :class:`SigmaReparamLinear` if ``sigma_reparam`` else a plain linear layer (:class:`~sb3_amago.nets.cpu_matmul.Linear`)."""
    if sigma_reparam:
        return SigmaReparamLinear(in_features, out_features, bias=bias)
    return Linear(in_features, out_features, bias=bias)
