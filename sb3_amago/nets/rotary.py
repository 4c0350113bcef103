"""The rotary position embedding (Su et al. 2021): queries and keys turned by angles proportional to
their time index, so that attention sees only the offset between two steps.

Under ``torch.compile`` on the CPU the tables are one opaque operator: inductor would evaluate their
cosines and sines again inside every layer's rotation, forward and backward, once per head.
"""

import torch as th

ROTARY_BASE = 10_000.0

Rotary = tuple[th.Tensor, th.Tensor] | None


def rotary_tables(time_idx: th.Tensor, d_head: int, base: float = ROTARY_BASE) -> tuple[th.Tensor, th.Tensor]:
    """Cosines and signed sines of the rotary embedding at integer time indices, per feature: feature
    ``i`` and its partner ``i + d_head / 2`` turn by the same angle, so ``cos`` holds each pair's
    cosine twice and ``sin`` its sine, negated on the first half (see :func:`apply_rotary`).

    :param time_idx: ``(B, L)`` int
    :param base: pair ``i`` of ``d_head / 2`` turns by ``base ** (-i / (d_head / 2))`` radians a step
    :return: ``cos``, ``sin``, each ``(B, 1, L, d_head)`` float32 (broadcast over heads)
    """
    half = d_head // 2
    freqs = base ** (-th.arange(half, device=time_idx.device, dtype=th.float32) / half)
    angles = time_idx.to(th.float32).unsqueeze(-1) * freqs  # (B, L, half)
    cos, sin = angles.cos(), angles.sin()
    return th.cat([cos, cos], dim=-1).unsqueeze(1), th.cat([-sin, sin], dim=-1).unsqueeze(1)


def apply_rotary(x: th.Tensor, rotary: tuple[th.Tensor, th.Tensor]) -> th.Tensor:
    """Rotate the feature pairs ``(x_i, x_{i + d/2})`` of ``x`` ``(..., B, H, L, d_head)`` by their
    angles: ``(x_1 cos - x_2 sin, x_2 cos + x_1 sin)``, as ``x * cos + swap(x) * sin`` with the tables
    of :func:`rotary_tables` (the same values as the four half-width products, in half the operators)."""
    cos, sin = (t.to(x.dtype) for t in rotary)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + th.cat([x2, x1], dim=-1) * sin


@th.library.custom_op("sb3_amago::rotary_tables", mutates_args=())
def compiled_rotary_tables(time_idx: th.Tensor, d_head: int, base: float) -> tuple[th.Tensor, th.Tensor]:
    """:func:`rotary_tables` as one operator for ``torch.compile`` (its CPU kernel is C++ where the
    package's kernels are built: :mod:`sb3_amago.nets.cpu_kernels`)."""
    return rotary_tables(time_idx, d_head, base)


@compiled_rotary_tables.register_fake
def _(time_idx: th.Tensor, d_head: int, base: float) -> tuple[th.Tensor, th.Tensor]:
    shape = (time_idx.shape[0], 1, time_idx.shape[1], d_head)
    return time_idx.new_empty(shape, dtype=th.float32), time_idx.new_empty(shape, dtype=th.float32)


def tables(time_idx: th.Tensor, d_head: int) -> tuple[th.Tensor, th.Tensor]:
    """:func:`rotary_tables`; the opaque operator while compiling for the CPU."""
    if time_idx.device.type == "cpu" and th.compiler.is_compiling():
        return compiled_rotary_tables(time_idx, d_head, ROTARY_BASE)
    return rotary_tables(time_idx, d_head)
