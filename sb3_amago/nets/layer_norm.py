"""The layer norm's backward as one operator in compiled CPU code: torch's own kernel, not inductor's.

Compiling, inductor decomposes ``aten.native_layer_norm_backward`` into elementwise code and
reductions, and its CPU code then passes over the layer's input and output gradient twice: down the
rows for the weight's and the bias's gradients, then along each row for the input's. At the
Transformer's ``(520, 512)`` feed-forward norm that is 261 us against 127 for torch's kernel, which
takes each row once and sums the weight's and bias's gradients per thread (2 threads, Intel Xeon,
warm caches; ``benchmarks/layer_norm_backward.py``). :data:`DECOMPOSITIONS` changes that one entry of
inductor's decomposition table (:func:`sb3_amago.compiled_update.inductor_decompositions`): the
backward of an fp32 CPU layer norm with a weight and a bias, all three gradients asked for, becomes
the operator ``sb3_amago::layer_norm_backward``, opaque to the compiler, which runs torch's kernel. A
compiled update on the CPU (:mod:`sb3_amago.compiled_update`) uses the table. The values are those
of eager code's backward given the forward's mean and reciprocal deviation (which the compiled forward
computes in its own order, so compiled and eager gradients differ at rounding level, as before).

Defined with torch.library's low-level API, like :mod:`~sb3_amago.nets.cpu_matmul`'s operator: no
Python wrapper around each call. Its Python kernel (``CompositeExplicitAutograd``) calls torch's
operator; the package's CPU kernels (:mod:`~sb3_amago.nets.cpu_kernels`) register a C++ one over it,
so that inductor's C++ wrapper calls torch's kernel without entering Python.
"""

from collections.abc import Sequence

import torch as th

_LIBRARY = th.library.Library("sb3_amago", "FRAGMENT")
_LIBRARY.define(
    "layer_norm_backward(Tensor grad_out, Tensor input, SymInt[] normalized_shape, Tensor mean, Tensor rstd, "
    "Tensor weight, Tensor bias) -> (Tensor, Tensor, Tensor)"
)

#: The three gradients, input's, weight's and bias's, all asked for.
_ALL_GRADIENTS = [True, True, True]


def _layer_norm_backward(
    grad_out: th.Tensor,
    input: th.Tensor,
    normalized_shape: Sequence[int],
    mean: th.Tensor,
    rstd: th.Tensor,
    weight: th.Tensor,
    bias: th.Tensor,
) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
    """The gradients of ``input`` ``(..., *normalized_shape)``, ``weight`` and ``bias``
    ``(*normalized_shape)`` of a layer norm whose output's gradient is ``grad_out`` and whose forward
    saved ``mean`` and ``rstd`` ``(..., 1, ...)``: torch's ``native_layer_norm_backward``."""
    grad_input, grad_weight, grad_bias = th.ops.aten.native_layer_norm_backward.default(
        grad_out, input, normalized_shape, mean, rstd, weight, bias, _ALL_GRADIENTS
    )
    return grad_input, grad_weight, grad_bias


_LIBRARY.impl("layer_norm_backward", _layer_norm_backward, "CompositeExplicitAutograd")
#: The operator: torch's layer-norm backward, all three gradients, opaque to ``torch.compile``.
layer_norm_backward = th.ops.sb3_amago.layer_norm_backward.default


# Shapes and strides under fake tensors: torch's operator has its own fake kernel (gradients written contiguous).
th.library.register_fake("sb3_amago::layer_norm_backward")(_layer_norm_backward)


def takes_operator(input: th.Tensor, weight: th.Tensor | None, bias: th.Tensor | None, output_mask: Sequence[bool]) -> bool:
    """Whether a layer norm's backward becomes the operator: an fp32 CPU input with a weight and a bias,
    every gradient asked for. Elsewhere (other devices and dtypes, no affine parameters, an input that
    needs no gradient) inductor's own decomposition stays."""
    return (
        input.device.type == "cpu"
        and input.dtype == th.float32
        and weight is not None
        and bias is not None
        and all(output_mask)
    )


def _decomposed_backward(
    grad_out: th.Tensor,
    input: th.Tensor,
    normalized_shape: Sequence[int],
    mean: th.Tensor,
    rstd: th.Tensor,
    weight: th.Tensor | None,
    bias: th.Tensor | None,
    output_mask: Sequence[bool],
) -> tuple[th.Tensor | None, th.Tensor | None, th.Tensor | None]:
    """What ``aten.native_layer_norm_backward`` becomes in the package's decomposition table."""
    if takes_operator(input, weight, bias, output_mask):
        assert weight is not None and bias is not None
        grad_input, grad_weight, grad_bias = layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias)
        return grad_input, grad_weight, grad_bias
    from torch._decomp.decompositions import native_layer_norm_backward

    return native_layer_norm_backward(grad_out, input, list(normalized_shape), mean, rstd, weight, bias, list(output_mask))


#: The entry the package's compiled CPU update puts in inductor's decomposition table
#: (:func:`sb3_amago.compiled_update.inductor_decompositions`).
DECOMPOSITIONS = {th.ops.aten.native_layer_norm_backward.default: _decomposed_backward}
