"""Dropout whose mask costs 16 random bits per element on the CPU.

torch's CPU dropout draws one number per element from its Mersenne Twister, one element at a time;
at the sizes AMAGO trains (``(B, L, d_ff)`` activations) that took a third of the Transformer's
forward pass. :class:`FastDropout` draws 64-bit integers instead and reads each as four 16-bit
fields, so the generator runs a quarter as often. An element is dropped where its field falls below
the threshold of the rate ``p_eff``, ``p`` rounded to a multiple of ``2**-15``; kept elements are
scaled by ``1 / (1 - p_eff)``, so the layer's expected output equals its input exactly
(``|p_eff - p| <= 2**-16``).

Other devices keep ``torch.nn.functional.dropout`` (their generators are fast already). The masks
come from torch's global generator, so ``torch.manual_seed`` makes them repeatable. Under
``torch.compile`` the mask is drawn by the same function, wrapped as the custom operator
``sb3_amago::keep_mask`` that the compiler keeps as one opaque call: inductor's own CPU dropout
made a compiled encoder slower than the eager one (``benchmarks/results/update_costs_L64.md``).
Leaving only the draws opaque and tracing the comparison into the graph was slower too: inductor's
code loads the int16 fields more slowly than the eager operators it would save (a masked
product's forward and backward, ``(8, 65, 512)``: 353 against 207 us with a float mask, AMD EPYC).
"""

import math
import sys

import torch as th
from torch import nn
from torch.nn import functional as F

_FIELD_BITS = 16
_FIELDS_PER_DRAW = 64 // _FIELD_BITS
#: Draws per row of the threshold comparison (at most; a divisor of the number of draws).
_DRAWS_PER_ROW = 16


def keep_mask(shape: th.Size, p: float, dtype: th.dtype, device: th.device) -> th.Tensor:
    """A ``shape`` tensor of ``1 / (1 - p_eff)`` where an element is kept and 0 where it is dropped.

    ``random_`` on int64 fills ``[0, 2**63)``, so of the four 16-bit fields of a draw the most
    significant one is uniform over ``[0, 2**15)`` and the other three over ``[-2**15, 2**15)``
    (read as signed). Each field is compared with the threshold of its own range; the rate is
    rounded to a multiple of ``2**-15`` so that both ranges drop at exactly ``p_eff``. The fields are
    compared as float32, where CPU comparisons are vectorised (int16 ones are not).
    """
    n = shape.numel()
    steps = round(p * 2 ** (_FIELD_BITS - 1))  # p_eff = steps / 2**15
    top = _FIELDS_PER_DRAW - 1 if sys.byteorder == "little" else 0  # the field holding the draw's sign bit
    low = -(2 ** (_FIELD_BITS - 1))
    thresholds = th.full((_FIELDS_PER_DRAW,), low + 2 * steps - 0.5, device=device)
    thresholds[top] = steps - 0.5
    n_draws = -(-n // _FIELDS_PER_DRAW)
    draws = th.empty(n_draws, dtype=th.int64, device=device).random_()
    # Rows of up to 16 draws, the thresholds repeated along them: broadcasting along a last axis of
    # 4 is ~18x slower on the CPU than along one of 64, for the same values.
    per_row = math.gcd(n_draws, _DRAWS_PER_ROW)
    fields = draws.view(th.int16).view(-1, _FIELDS_PER_DRAW * per_row).to(th.float32)  # (n / (4 r), 4 r)
    thresholds = thresholds.repeat(per_row)
    # In place: 1.0 where a field is above its threshold (kept; never equal, the thresholds are
    # half-integers), then scaled; two passes over the fields where a sign() formula took four.
    scale = 1.0 / (1.0 - steps / 2 ** (_FIELD_BITS - 1))
    mask = fields.gt_(thresholds).mul_(scale)
    return mask.view(-1)[:n].view(shape).to(dtype)


# Seeded randomness: the compiler neither merges two calls nor recomputes one for the backward.
@th.library.custom_op("sb3_amago::keep_mask", mutates_args=(), tags=(th.Tag.nondeterministic_seeded,))
def compiled_keep_mask(like: th.Tensor, p: float) -> th.Tensor:
    """:func:`keep_mask` of ``like``'s shape, dtype and device, as one operator for ``torch.compile``."""
    return keep_mask(like.shape, p, like.dtype, like.device)


@compiled_keep_mask.register_fake
def _(like: th.Tensor, p: float) -> th.Tensor:
    return like.new_empty(like.shape)


class FastDropout(nn.Dropout):
    """``nn.Dropout`` (same argument, same ``train`` / ``eval`` behaviour) with the cheaper CPU mask
    of :func:`keep_mask`, compiled or not."""

    def forward(self, x: th.Tensor) -> th.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu" or self.p >= 1.0:
            return F.dropout(x, self.p, True, self.inplace)
        if th.compiler.is_compiling():
            return x * compiled_keep_mask(x.detach(), self.p)
        return x * keep_mask(x.shape, self.p, x.dtype, x.device)
