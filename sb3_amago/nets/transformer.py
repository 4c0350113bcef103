"""AMAGO's causal Transformer trajectory encoder, with a key/value cache for acting.

Architecture (per block, pre-norm with NormFormer's extra normalisations)::

    h = x + LN_attn(HeadScale(Attn(LN_1(x))))
    y = h + Drop(FF_2(Drop(LN_ff(LeakyReLU(FF_1(LN_2(h)))))))

followed by a final LayerNorm. The query/key/value, attention-output and both feed-forward
projections are sigma-reparameterised (:mod:`sb3_amago.nets.sigma_reparam`). The position embedding
is computed from each step's *global* time index in its rollout, so a window cut from the middle
of a rollout keeps absolute time.

Acting (``step``) caches the keys and values of every layer for each env. While an env has seen at
most ``max_seq_len`` steps since its last reset, a step embeds only the new timestep and attends
over the cache: O(context) work per step. Once the context is full it slides (the oldest step
drops out), in one of two ways (``window_slide``):

- ``"recompute"`` (default, exact): the cached upper-layer keys of the remaining steps were computed
  with the dropped step in their context, so reusing them would not match training; for each env
  whose context is full, the step recomputes the whole window of the last ``max_seq_len`` layer-0
  inputs: O(n_layers * max_seq_len^2 * d_model) work per step for those envs only.
- ``"roll"`` (cheap, approximate): the new step overwrites the oldest cache slot and attends over
  the cache as before, O(max_seq_len) per step. Keys and values of layers above the first are then
  stale: each was computed with up to ``max_seq_len - 1`` earlier steps in its context that training
  windows would not show. With one layer there is nothing stale and both ways agree.
"""

import math
from dataclasses import dataclass
from typing import cast

import torch as th
from torch import nn
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from sb3_amago.nets import cpu_attention, cpu_kernels
from sb3_amago.nets.activations import leaky_relu
from sb3_amago.nets.base import TrajEncoder
from sb3_amago.nets.cpu_matmul import Linear
from sb3_amago.nets.dropout import FastDropout
from sb3_amago.nets.rotary import Rotary, apply_rotary, tables
from sb3_amago.nets.sigma_reparam import make_linear

#: Attention kernels allowed on CUDA: torch's own, less cuDNN's. In bf16 torch 2.11 picks cuDNN
#: attention on an H200, which took ~5 ms of host time per forward call and ~3.6 ms per backward at
#: this model's sizes (8 x 8 heads x 257 x 16; torch.profiler), more than half of an update.
CUDA_ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention(q: th.Tensor, k: th.Tensor, v: th.Tensor, **kwargs) -> th.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, **kwargs)``, on CUDA with :data:`CUDA_ATTENTION_BACKENDS` only."""
    if not q.is_cuda:
        return F.scaled_dot_product_attention(q, k, v, **kwargs)
    with sdpa_kernel(CUDA_ATTENTION_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


#: Where the package's CPU kernels are not built (:mod:`sb3_amago.nets.cpu_kernels`), sequences of at
#: most this many steps take torch's math attention (batched products and a softmax) in the training
#: pass on a CPU, longer ones its flash kernel. At head width 16 the flash kernel's
#: per-block products cost more than the whole (L, L) scores at short windows: with the math backend a
#: fp32 update ran +6% at 65 steps and +10% at 129 compiled (+2-3% eager), -4% at 193 and -13% at 257
#: (AMD EPYC, 2 threads, the reference update, both variants timed alternately in one process).
CPU_MATH_ATTENTION_MAX_STEPS = 129


def uses_cpu_kernel(q: th.Tensor) -> bool:
    """Whether attention over ``q`` runs on the package's kernel: fp32 on a CPU where it is built
    (:mod:`sb3_amago.nets.cpu_kernels`; eager calls build it)."""
    if q.device.type != "cpu" or q.dtype != th.float32:
        return False
    if not th.compiler.is_compiling():
        cpu_kernels.load()  # once per process; AMAGO loads it before compiling
    return cpu_kernels.loaded()


def causal_attention(q: th.Tensor, k: th.Tensor, v: th.Tensor) -> th.Tensor:
    """Causal self-attention over whole sequences, ``(B, H, L, Dh)`` each -> ``(B, H, L, Dh)``: the
    package's kernel where :func:`uses_cpu_kernel`, :func:`torch_causal_attention` otherwise."""
    if uses_cpu_kernel(q):
        return cpu_attention.causal_attention(q, k, v)
    return torch_causal_attention(q, k, v)


def torch_causal_attention(q: th.Tensor, k: th.Tensor, v: th.Tensor) -> th.Tensor:
    """:func:`causal_attention` on torch's kernels: :func:`causal_math_attention` on a CPU up to
    :data:`CPU_MATH_ATTENTION_MAX_STEPS` steps, :func:`attention` otherwise."""
    if q.device.type == "cpu" and q.shape[-2] <= CPU_MATH_ATTENTION_MAX_STEPS:
        return causal_math_attention(q, k, v)
    return attention(q, k, v, is_causal=True)


def causal_math_attention(q: th.Tensor, k: th.Tensor, v: th.Tensor) -> th.Tensor:
    """torch's math backend for causal attention (``scaled_dot_product_attention`` under
    ``SDPBackend.MATH`` with ``is_causal=True``), operator for operator, so the same values and
    gradients bit for bit, less its softmax's check for rows with every score masked, which a
    causal mask never has: that check (an ``all`` over the ``(B, H, L, L)`` scores and a ``where``)
    took a fifth of the backend's eager time at ``(8, 8, 65, 16)`` (964 against 769 us forward and
    backward, AMD EPYC, 2 threads). Compiled, the two are one graph: the same kernels and speed.
    """
    n, s = q.shape[-2], k.shape[-2]
    future = th.ones(n, s, dtype=th.bool, device=q.device).triu_(1)
    mask = th.zeros(n, s, dtype=q.dtype, device=q.device).masked_fill_(future, float("-inf"))  # (L, S)
    root_scale = math.sqrt(1.0 / math.sqrt(q.shape[-1]))  # the backend scales q and k by it, each
    scores = th.matmul(q * root_scale, k.transpose(-2, -1) * root_scale)  # (B, H, L, S)
    return th.matmul(th.softmax(scores.add_(mask), -1), v)


#: Position schemes: added to the layer-0 input ("sinusoidal", "learnable"), rotating queries and keys
#: in every layer ("rotary", relative: attention sees only the offset between two steps), or none.
POS_EMB_TYPES = ("sinusoidal", "learnable", "rotary", "none")
#: How acting continues once a rollout is longer than the window (see the module docstring).
WINDOW_SLIDES = ("recompute", "roll")


@dataclass
class TransformerState:
    """Per-env acting state of :class:`TransformerTrajEncoder`.

    ``step`` and ``reset_state`` update these tensors in place (the cache is large) and return the
    same object.

    :param keys: cached keys ``(n_layers, N, n_heads, max_seq_len, d_head)``
    :param values: cached values, same shape
    :param inputs: the layer-0 inputs (embedded timesteps) of the last ``max_seq_len`` steps,
        a ring buffer ``(N, max_seq_len, d_model)``: step ``c`` since reset is in slot ``c % max_seq_len``
    :param count: ``(N,)`` int64, steps seen since each env's last reset
    """

    keys: th.Tensor
    values: th.Tensor
    inputs: th.Tensor
    count: th.Tensor

    @property
    def n_envs(self) -> int:
        return self.count.shape[0]


def sinusoidal_embedding(time_idx: th.Tensor, d_model: int) -> th.Tensor:
    """Sinusoidal embedding of integer time indices (Vaswani et al. 2017), ``[sin, cos]`` halves.

    :param time_idx: ``(...)`` int
    :return: ``(..., d_model)`` float32
    """
    half = d_model // 2
    freqs = th.exp(th.arange(half, device=time_idx.device, dtype=th.float32) * (-math.log(10000.0) / half))
    angles = time_idx.to(th.float32).unsqueeze(-1) * freqs  # (..., half)
    return th.cat([angles.sin(), angles.cos()], dim=-1)


def split_heads(qkv: th.Tensor) -> th.Tensor:
    """The projection ``(B, L, 3, H, Dh)`` -> queries, keys and values ``(3, B, H, L, Dh)``, a view."""
    return qkv.permute(2, 0, 3, 1, 4)


def rotate(qkv: th.Tensor, rotary: Rotary) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
    """Queries, keys and values ``(B, H, L, Dh)`` from their stack ``(3, B, H, L, Dh)``, queries and keys
    turned by :func:`~sb3_amago.nets.rotary.rotary_tables` when given (in one pass: half the operator calls)."""
    if rotary is None:
        q, k, v = qkv.unbind(0)
        return q, k, v
    q, k = apply_rotary(qkv[:2], rotary).unbind(0)
    if th.compiler.is_compiling():
        # Inductor lays the rotated queries and keys out in an order for which the CPU flash
        # attention's compiled backward fixes a stride of the first window length: a batch of
        # another length then fails an assertion. Contiguous ones it handles at any length.
        q, k = q.contiguous(), k.contiguous()
    return q, k, qkv[2]


class TransformerBlock(nn.Module):
    """One pre-norm NormFormer block; see the module docstring.

    :param d_model: residual stream width
    :param n_heads: attention heads
    :param d_ff: feed-forward hidden width
    :param dropout: dropout on the feed-forward hidden activation and output
    :param sigma_reparam: sigma-reparameterise the four projections
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, sigma_reparam: bool) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.norm_attn_in = nn.LayerNorm(d_model)
        self.qkv = make_linear(d_model, 3 * d_model, sigma_reparam)
        self.head_scale = nn.Parameter(th.ones(n_heads))
        self.attn_out = make_linear(d_model, d_model, sigma_reparam)
        self.norm_attn_out = nn.LayerNorm(d_model)
        self.norm_ff_in = nn.LayerNorm(d_model)
        self.ff_in = make_linear(d_model, d_ff, sigma_reparam)
        self.norm_ff_hidden = nn.LayerNorm(d_ff)
        self.ff_out = make_linear(d_ff, d_model, sigma_reparam)
        self.dropout = FastDropout(dropout)

    def _projection(self, x: th.Tensor) -> th.Tensor:
        """``(B, L, D)`` residual stream -> the projection of queries, keys and values ``(B, L, 3, H, Dh)``."""
        batch, length, _ = x.shape
        return self.qkv(self.norm_attn_in(x)).view(batch, length, 3, self.n_heads, self.d_head)

    def _finish(self, x: th.Tensor, attn: th.Tensor) -> th.Tensor:
        """Attention output ``(B, H, L, Dh)`` + residual ``(B, L, D)`` -> block output ``(B, L, D)``."""
        attn = attn * self.head_scale.to(attn.dtype)[:, None, None]
        attn = attn.transpose(1, 2).flatten(2)  # (B, L, D)
        x = x + self.norm_attn_out(self.attn_out(attn))
        hidden = self.norm_ff_hidden(leaky_relu(self.ff_in(self.norm_ff_in(x))))  # (B, L, d_ff)
        return x + self.dropout(self.ff_out(self.dropout(hidden)))

    def forward(self, x: th.Tensor, rotary: Rotary = None) -> th.Tensor:
        """Causal pass over whole sequences: ``(B, L, D)`` -> ``(B, L, D)``."""
        qkv = self._projection(x)
        if uses_cpu_kernel(qkv):
            # The kernel reads the projection where it lies and turns queries and keys as it reads
            # them (and their gradients back), writes its output in the layout the output projection
            # reads and returns the projection's gradient whole: no rotation pass and no copy.
            return self._finish(x, cpu_attention.projection_attention(qkv, rotary))
        q, k, v = rotate(split_heads(qkv), rotary)
        if q.device.type == "cpu" and q.dtype == th.bfloat16:
            # torch's CPU flash-attention backward is 2-5x slower in bf16 than in fp32 at these
            # sizes, and attention is a small share of the FLOPs: it runs in fp32. Autocast would
            # cast fp32 inputs straight back to bf16, so it is off for the call.
            with th.autocast("cpu", enabled=False):
                attn = causal_attention(q.float(), k.float(), v.float())
            return self._finish(x, attn.to(q.dtype))
        return self._finish(x, causal_attention(q, k, v))

    def step(
        self, x: th.Tensor, keys: th.Tensor, values: th.Tensor, slot: th.Tensor, filled: th.Tensor, rotary: Rotary
    ) -> th.Tensor:
        """One new position per env, attending over a cache that it first writes into.

        :param x: ``(N, D)`` residual stream of the new position
        :param keys: this layer's key cache ``(N, H, S, Dh)``, updated in place at ``slot``
        :param values: value cache, same shape
        :param slot: ``(N,)`` int64 cache slot of the new position
        :param filled: ``(N, S')`` bool, the slots ``[:S']`` the new position attends to
        :param rotary: rotary tables of the new position (keys are cached already rotated)
        :return: ``(N, D)``
        """
        envs = th.arange(x.shape[0], device=x.device)
        q, k, v = rotate(split_heads(self._projection(x.unsqueeze(1))), rotary)  # (N, H, 1, Dh)
        keys[envs, :, slot] = k[:, :, 0].to(keys.dtype)
        values[envs, :, slot] = v[:, :, 0].to(values.dtype)
        width = filled.shape[1]
        attn = attention(
            q,
            keys[:, :, :width].to(q.dtype),
            values[:, :, :width].to(q.dtype),
            attn_mask=filled[:, None, None, :],
        )  # (N, H, 1, Dh)
        return self._finish(x.unsqueeze(1), attn).squeeze(1)


class TransformerTrajEncoder(TrajEncoder):
    """AMAGO's causal Transformer over timestep embeddings.

    :param d_in: size of each timestep embedding
    :param max_seq_len: longest sequence of the full forward, and the acting context length
    :param d_model: residual stream width (the output size)
    :param n_heads: attention heads; must divide ``d_model``
    :param d_ff: feed-forward hidden width
    :param n_layers: number of blocks
    :param dropout: dropout on the input embedding and in the feed-forward layers
    :param pos_emb: ``"rotary"`` (relative; any time index), ``"sinusoidal"`` (absolute, any time
        index), ``"learnable"`` (absolute, a table of ``max_time`` rows) or ``"none"``
    :param max_time: size of the learnable position table: time indices must be below it
    :param sigma_reparam: sigma-reparameterise the attention and feed-forward projections
    :param window_slide: acting past ``max_seq_len`` steps: ``"recompute"`` the window (exact) or
        ``"roll"`` the cache (O(context) per step, stale upper-layer keys)
    """

    def __init__(
        self,
        d_in: int,
        max_seq_len: int,
        d_model: int = 256,
        n_heads: int = 8,
        d_ff: int = 1024,
        n_layers: int = 3,
        dropout: float = 0.05,
        pos_emb: str = "rotary",
        max_time: int | None = None,
        sigma_reparam: bool = True,
        window_slide: str = "recompute",
    ) -> None:
        super().__init__(d_in, max_seq_len)
        if window_slide not in WINDOW_SLIDES:
            raise ValueError(f"Unknown window_slide '{window_slide}', expected one of {WINDOW_SLIDES}")
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        if pos_emb not in POS_EMB_TYPES:
            raise ValueError(f"Unknown pos_emb '{pos_emb}', expected one of {POS_EMB_TYPES}")
        if pos_emb == "sinusoidal" and d_model % 2 != 0:
            raise ValueError(f"The sinusoidal position embedding needs an even d_model, got {d_model}")
        if pos_emb == "rotary" and (d_model // n_heads) % 2 != 0:
            raise ValueError(
                f"The rotary position embedding needs an even head size, got d_model / n_heads = {d_model // n_heads}"
            )
        if pos_emb == "learnable" and (max_time is None or max_time < 1):
            raise ValueError(f"pos_emb='learnable' needs max_time >= 1 (the longest rollout, in steps), got {max_time}")
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_layers = n_layers
        self.pos_emb_type = pos_emb
        self.max_time = max_time
        self.window_slide = window_slide
        self.input_proj = Linear(d_in, d_model)
        self.pos_table = nn.Embedding(max_time, d_model) if pos_emb == "learnable" and max_time is not None else None
        self.emb_dropout = FastDropout(dropout)
        self.blocks = nn.ModuleList(TransformerBlock(d_model, n_heads, d_ff, dropout, sigma_reparam) for _ in range(n_layers))
        self.out_norm = nn.LayerNorm(d_model)

    @property
    def out_dim(self) -> int:
        return self.d_model

    def _check_time(self, time_idx: th.Tensor, real: th.Tensor | None = None) -> None:
        """Raise if a (real, where ``real`` is given) time index falls outside the learnable table."""
        if self.pos_table is None:
            return
        checked = time_idx if real is None else time_idx[real]
        if checked.numel() == 0:
            return
        low, high = (int(v) for v in th.stack([checked.min(), checked.max()]).tolist())
        size = self.pos_table.num_embeddings
        if low < 0 or high >= size:
            raise ValueError(
                f"Time index {low if low < 0 else high} is outside the learnable position table of size "
                f"max_time={size} (valid indices 0..{size - 1}); build the encoder with a larger max_time"
            )

    def _embed(self, x: th.Tensor, time_idx: th.Tensor) -> th.Tensor:
        """Layer-0 input before dropout: ``(..., d_in)``, ``(...)`` -> ``(..., d_model)``."""
        h = self.input_proj(x)
        if self.pos_emb_type == "sinusoidal":
            return h + sinusoidal_embedding(time_idx, self.d_model).to(h.dtype)
        if self.pos_table is not None:
            return h + self.pos_table(time_idx.clamp(0, self.pos_table.num_embeddings - 1)).to(h.dtype)
        return h

    def _rotary(self, time_idx: th.Tensor) -> Rotary:
        """Rotary tables for ``(B, L)`` time indices, or None for the other schemes."""
        return tables(time_idx, self.d_model // self.n_heads) if self.pos_emb_type == "rotary" else None

    def _run_blocks(self, h: th.Tensor, time_idx: th.Tensor) -> th.Tensor:
        """Causal pass of the embedded sequence ``(B, L, d_model)`` at times ``(B, L)`` through every
        block + final norm."""
        rotary = self._rotary(time_idx)
        h = self.emb_dropout(h)
        for block in self.blocks:
            h = block(h, rotary)
        return self.out_norm(h)

    def forward(self, x: th.Tensor, time_idx: th.Tensor, real: th.Tensor) -> th.Tensor:
        """:param x: ``(B, L, d_in)``; ``time_idx`` ``(B, L)`` int64; ``real`` ``(B, L)`` bool
        :return: ``(B, L, d_model)``
        """
        length = x.shape[1]
        if length > self.max_seq_len:
            raise ValueError(f"Sequence length {length} exceeds max_seq_len={self.max_seq_len} of the Transformer encoder")
        self._check_time(time_idx, real)
        x = x.masked_fill(~real.unsqueeze(-1), 0.0)
        return self._run_blocks(self._embed(x, time_idx), time_idx)

    def init_state(self, n_envs: int, device: th.device | str, dtype: th.dtype = th.float32) -> TransformerState:
        cache_shape = (self.n_layers, n_envs, self.n_heads, self.max_seq_len, self.d_model // self.n_heads)
        return TransformerState(
            keys=th.zeros(cache_shape, device=device, dtype=dtype),
            values=th.zeros(cache_shape, device=device, dtype=dtype),
            inputs=th.zeros(n_envs, self.max_seq_len, self.d_model, device=device, dtype=dtype),
            count=th.zeros(n_envs, device=device, dtype=th.int64),
        )

    def reset_state(self, state: TransformerState, done: th.Tensor) -> TransformerState:
        state.count.masked_fill_(done.to(state.count.device, th.bool), 0)
        return state

    def step(self, x: th.Tensor, time_idx: th.Tensor, state: TransformerState) -> tuple[th.Tensor, TransformerState]:
        """:param x: ``(N, d_in)``; ``time_idx`` ``(N,)``
        :return: ``(N, d_model)`` and ``state`` (updated in place)
        """
        n_envs, window = x.shape[0], self.max_seq_len
        self._check_time(time_idx)
        envs = th.arange(n_envs, device=x.device)
        emb = self._embed(x, time_idx)  # (N, d_model)
        slot = state.count % window  # (N,)
        state.inputs[envs, slot] = emb.to(state.inputs.dtype)
        full = (state.count >= window) & (self.window_slide == "recompute")  # (N,) these envs recompute their window
        max_count, n_full = (int(v) for v in th.stack([state.count.max(), full.sum()]).tolist())
        out = th.empty(n_envs, self.d_model, device=x.device, dtype=emb.dtype)
        if n_full < n_envs:
            width = min(max_count + 1, window)
            filled = th.arange(width, device=x.device) <= state.count.unsqueeze(1)  # (N, width)
            h = self.emb_dropout(emb)
            rotary = self._rotary(time_idx.unsqueeze(1))
            for layer, block in enumerate(cast("list[TransformerBlock]", self.blocks)):
                h = block.step(h, state.keys[layer], state.values[layer], slot, filled, rotary)
            out = self.out_norm(h)
        if n_full > 0:
            full_envs = full.nonzero().squeeze(1)  # (F,)
            order = (state.count[full_envs, None] + 1 + th.arange(window, device=x.device)) % window  # (F, S)
            times = time_idx[full_envs, None] - window + 1 + th.arange(window, device=x.device)  # (F, S), oldest first
            recomputed = self._run_blocks(state.inputs[full_envs[:, None], order].to(emb.dtype), times)  # (F, S, D)
            out = out.to(recomputed.dtype).index_put((full_envs,), recomputed[:, -1])
        state.count += 1
        return out, state
