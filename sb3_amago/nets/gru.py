"""A GRU trajectory encoder: the recurrent alternative to the Transformer."""

from dataclasses import dataclass

import torch as th
from torch import nn

from sb3_amago.nets.base import TrajEncoder


@dataclass
class GRUState:
    """Per-env acting state of :class:`GRUTrajEncoder`.

    :param hidden: ``(n_layers, N, d_hidden)`` GRU hidden state
    """

    hidden: th.Tensor

    @property
    def n_envs(self) -> int:
        return self.hidden.shape[1]


class GRUTrajEncoder(TrajEncoder):
    """Multi-layer GRU over timestep embeddings, followed by a LayerNorm.

    The hidden state is carried over the whole rollout while acting (it never slides), and the full
    forward starts every sequence from a zero hidden state, so a full forward over a rollout equals
    stepping through it. ``max_seq_len`` is recorded but does not limit the full forward.

    :param d_in: size of each timestep embedding
    :param max_seq_len: training window length
    :param d_hidden: hidden size (the output size)
    :param n_layers: stacked GRU layers
    """

    def __init__(self, d_in: int, max_seq_len: int, d_hidden: int = 256, n_layers: int = 2) -> None:
        super().__init__(d_in, max_seq_len)
        self.d_hidden = d_hidden
        self.n_layers = n_layers
        self.gru = nn.GRU(d_in, d_hidden, num_layers=n_layers, batch_first=True)
        self.out_norm = nn.LayerNorm(d_hidden)

    @property
    def out_dim(self) -> int:
        return self.d_hidden

    def _run(self, x: th.Tensor, hidden: th.Tensor | None) -> tuple[th.Tensor, th.Tensor]:
        """``(B, L, d_in)`` and ``(n_layers, B, d_hidden)`` or None -> outputs ``(B, L, d_hidden)``, last hidden.

        The GRU runs in its parameters' dtype (CPU autocast leaves it in float32).
        """
        dtype = next(self.gru.parameters()).dtype
        if hidden is not None:
            hidden = hidden.to(dtype)
        out, hidden = self.gru(x.to(dtype), hidden)
        return self.out_norm(out), hidden

    def forward(self, x: th.Tensor, time_idx: th.Tensor, real: th.Tensor) -> th.Tensor:
        """:param x: ``(B, L, d_in)``; ``time_idx`` ``(B, L)`` (unused); ``real`` ``(B, L)``
        :return: ``(B, L, d_hidden)``
        """
        return self._run(x.masked_fill(~real.unsqueeze(-1), 0.0), None)[0]

    def init_state(self, n_envs: int, device: th.device | str, dtype: th.dtype = th.float32) -> GRUState:
        return GRUState(hidden=th.zeros(self.n_layers, n_envs, self.d_hidden, device=device, dtype=dtype))

    def reset_state(self, state: GRUState, done: th.Tensor) -> GRUState:
        keep = ~done.to(state.hidden.device, th.bool)
        return GRUState(hidden=state.hidden * keep[None, :, None].to(state.hidden.dtype))

    def step(self, x: th.Tensor, time_idx: th.Tensor, state: GRUState) -> tuple[th.Tensor, GRUState]:
        """:param x: ``(N, d_in)``; ``time_idx`` ``(N,)`` (unused)
        :return: ``(N, d_hidden)`` and the new state
        """
        out, hidden = self._run(x.unsqueeze(1), state.hidden)
        return out.squeeze(1), GRUState(hidden=hidden.to(state.hidden.dtype))
