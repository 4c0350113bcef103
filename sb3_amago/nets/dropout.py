"""Dropout whose CPU mask is a hash of one random key, not one draw of torch's generator per element.

torch's CPU dropout draws one number per element from its Mersenne Twister, one element at a time;
at the sizes AMAGO trains (``(B, L, d_ff)`` activations) that took a third of the Transformer's
forward pass. :class:`FastDropout` draws one 64-bit key per mask from torch's generator and
expands it with SplitMix64's output function (Steele, Lea and Flood, 2014) over a counter: draw
``d`` of a mask is ``mix(key + d * GAMMA)``, and each draw gives four 16-bit fields, one per
element. That is integer arithmetic over whole tensors, which the CPU vectorises: eager it runs as a
few operators over the draws; under ``torch.compile`` it is traced into the graph, where inductor
fuses it into the kernels that apply the mask (forward and backward), so no mask is drawn or stored
at all. Where the package's CPU kernels are loaded (:mod:`sb3_amago.nets.cpu_kernels`), fp32 masks
come from one C++ pass instead (``cpu_dropout.cpp``), eager and compiled: the reference update ran
7-9% faster eager at L = 64, and compiled 1.7% faster at L = 256 (and 0.6% at 64), where the traced
hash was computed again in every kernel that read the mask. All compute the same integers, so every
path drops the same elements for a key.

An element is dropped where its field falls below the threshold of the rate ``p_eff``, ``p`` rounded
to a multiple of ``2**-15``; kept elements are scaled by ``1 / (1 - p_eff)``, so the layer's expected
output equals its input exactly (``|p_eff - p| <= 2**-16``). Other devices keep
``torch.nn.functional.dropout`` (their generators are fast already). The keys come from torch's
global generator, so ``torch.manual_seed`` makes the masks repeatable.
"""

import sys

import torch as th
from torch import nn
from torch.nn import functional as F

from sb3_amago.nets import cpu_kernels

_FIELD_BITS = 16
_FIELDS_PER_DRAW = 64 // _FIELD_BITS


def _int64(value: int) -> int:
    """An unsigned 64-bit constant as the signed int64 with the same bits."""
    return value - 2**64 if value >= 2**63 else value


#: SplitMix64's counter increment and its output function's multipliers and shifts.
_GAMMA = _int64(0x9E3779B97F4A7C15)
_MULTIPLIERS = (_int64(0xBF58476D1CE4E5B9), _int64(0x94D049BB133111EB))
_SHIFTS = (30, 27, 31)


def _shift_right(z: th.Tensor, bits: int) -> th.Tensor:
    """Logical right shift of int64 ``z`` (torch's ``>>`` copies the sign bit)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def splitmix64(z: th.Tensor) -> th.Tensor:
    """SplitMix64's output function of int64 ``z``, elementwise (products wrap modulo ``2**64``)."""
    for bits, multiplier in zip(_SHIFTS, _MULTIPLIERS):
        z = (z ^ _shift_right(z, bits)) * multiplier
    return z ^ _shift_right(z, _SHIFTS[-1])


def _rate_steps(p: float) -> int:
    """``p_eff * 2**15``: the drop rate in steps of ``2**-15``."""
    return round(p * 2 ** (_FIELD_BITS - 1))


def _scale(steps: int) -> float:
    return 1.0 / (1.0 - steps / 2 ** (_FIELD_BITS - 1))


def draw_key(device: th.device) -> th.Tensor:
    """One key for a mask: a 0-d int64 tensor from torch's global generator. Two masks of ``n``
    elements share a draw only if their keys lie fewer than ``n / 4`` steps of ``GAMMA`` apart, a
    chance of about ``n / 2**63`` per pair."""
    return th.empty((), dtype=th.int64, device=device).random_()


# Their Python kernels are registered for every device; where the package's CPU kernels are built,
# C++ ones with the same values take the CPU's place (cpu_kernels.cpp, register_operators).
_LIBRARY = th.library.Library("sb3_amago", "FRAGMENT")
_LIBRARY.define("dropout_key(Tensor like) -> Tensor", tags=(th.Tag.nondeterministic_seeded,))
_LIBRARY.impl("dropout_key", lambda like: draw_key(like.device), "CompositeExplicitAutograd")
#: :func:`draw_key` as one opaque operator: the compiler neither merges two draws nor replaces
#: torch's generator with its own, so compiled and eager layers draw the same keys for a seed.
compiled_draw_key = th.ops.sb3_amago.dropout_key.default


@th.library.register_fake("sb3_amago::dropout_key")
def _(like: th.Tensor) -> th.Tensor:
    return like.new_empty((), dtype=th.int64)


_LIBRARY.define("dropout_keep_mask(Tensor like, Tensor key, int steps, float scale) -> Tensor")
_LIBRARY.impl(
    "dropout_keep_mask",
    lambda like, key, steps, scale: cpu_kernels.kernels().dropout_keep_mask(like, key, steps, scale),
    "CompositeExplicitAutograd",
)
#: The C++ kernel's mask (``cpu_dropout.cpp``) as one operator: ``like``'s shape (its values are not
#: read), the key, the rate in steps of ``2**-15`` and the kept elements' value; fp32, contiguous.
native_keep_mask = th.ops.sb3_amago.dropout_keep_mask.default


@th.library.register_fake("sb3_amago::dropout_keep_mask")
def _(like: th.Tensor, key: th.Tensor, steps: int, scale: float) -> th.Tensor:
    return th.empty(like.shape, dtype=th.float32, device=like.device)


def _native_mask(like: th.Tensor, p: float, key: th.Tensor) -> th.Tensor:
    """:data:`native_keep_mask` at the rate ``p``, for ``like``'s shape and ``key``."""
    steps = _rate_steps(p)
    return native_keep_mask(like, key, steps, _scale(steps))


def uses_native_mask(dtype: th.dtype, device: th.device) -> bool:
    """Whether masks of ``dtype`` on ``device`` come from the C++ kernel: fp32 on a CPU where the
    package's kernels are loaded."""
    return device.type == "cpu" and dtype == th.float32 and cpu_kernels.loaded()


def keep_mask(shape: th.Size, p: float, dtype: th.dtype, device: th.device, key: th.Tensor | None = None) -> th.Tensor:
    """A ``shape`` tensor of ``1 / (1 - p_eff)`` where an element is kept and 0 where it is dropped,
    for ``key`` (default: :func:`draw_key`).

    Element ``i`` reads 16-bit field ``i % 4`` of draw ``i // 4`` (the draw's bits ``16 (i % 4)`` and
    up). Every field is uniform over ``[-2**15, 2**15)`` read as signed, and the element is kept where
    it is at or above ``-2**15 + 2 * 2**15 p_eff``. The fields are compared as float32, where CPU
    comparisons are vectorised (int16 ones are not).
    """
    key = draw_key(device) if key is None else key
    if uses_native_mask(dtype, device):
        return _native_mask(th.empty((), device=device).expand(shape), p, key)
    steps = _rate_steps(p)
    n = shape.numel()
    n_draws = -(-n // _FIELDS_PER_DRAW)
    draws = splitmix64(th.arange(n_draws, dtype=th.int64, device=device).mul_(_GAMMA).add_(key))  # (n / 4,)
    fields = draws.view(th.int16)  # field j of draw d at 4 d + j (little-endian)
    if sys.byteorder != "little":
        fields = fields.view(-1, _FIELDS_PER_DRAW).flip(1).reshape(-1)
    # 1.0 where the field is above the threshold (kept; never equal, the threshold is a
    # half-integer), then scaled: two passes over the fields.
    threshold = -(2 ** (_FIELD_BITS - 1)) + 2 * steps - 0.5
    mask = fields.to(th.float32).gt_(threshold).mul_(_scale(steps))
    return mask[:n].view(shape).to(dtype)


def traced_keep_mask(like: th.Tensor, p: float, key: th.Tensor) -> th.Tensor:
    """:func:`keep_mask`'s values for ``like``'s shape and ``key``, written per element (each element
    hashes its own draw), for ``torch.compile`` to fuse into the kernels that read the mask."""
    steps = _rate_steps(p)
    index = th.arange(like.numel(), dtype=th.int64, device=like.device).view(like.shape)
    draws = splitmix64(key + (index >> 2) * _GAMMA)
    fields = ((draws >> ((index & 3) * _FIELD_BITS)) & 0xFFFF) ^ 0x8000  # the signed field plus 2**15
    # 1 where the field is at or above the threshold, 0 below, by the sign of the difference: no
    # bool tensor, which inductor's CPU code would save for the backward and stores slowly.
    kept = ((fields - 2 * steps) >> 63) + 1
    return kept.to(like.dtype) * _scale(steps)


class FastDropout(nn.Dropout):
    """``nn.Dropout`` (same argument, same ``train`` / ``eval`` behaviour) with the cheaper CPU mask
    of :func:`keep_mask`, compiled or not."""

    def forward(self, x: th.Tensor) -> th.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu" or self.p >= 1.0:
            return F.dropout(x, self.p, True, self.inplace)
        if th.compiler.is_compiling():
            key = compiled_draw_key(x.detach())
            if uses_native_mask(x.dtype, x.device):
                return x * _native_mask(x.detach(), self.p, key)
            return x * traced_keep_mask(x, self.p, key)
        return x * keep_mask(x.shape, self.p, x.dtype, x.device)
