"""A memory-free trajectory encoder: the same MLP applied to each timestep (the no-memory ablation)."""

from dataclasses import dataclass

import torch as th
from torch import nn

from sb3_amago.nets.activations import leaky_relu
from sb3_amago.nets.base import TrajEncoder
from sb3_amago.nets.cpu_matmul import Linear


@dataclass
class FFState:
    """Acting state of :class:`FFTrajEncoder`: nothing is remembered, only the number of envs."""

    n_envs: int


class FFTrajEncoder(TrajEncoder):
    """Per-timestep MLP with leaky ReLU activations and a final LayerNorm; sees no other timestep.

    :param d_in: size of each timestep embedding
    :param max_seq_len: training window length (recorded only)
    :param d_hidden: width of every layer (the output size)
    :param n_layers: number of linear layers
    """

    def __init__(self, d_in: int, max_seq_len: int, d_hidden: int = 256, n_layers: int = 2) -> None:
        super().__init__(d_in, max_seq_len)
        if n_layers < 1:
            raise ValueError(f"n_layers must be >= 1, got {n_layers}")
        self.d_hidden = d_hidden
        self.layers = nn.ModuleList(Linear(d_in if i == 0 else d_hidden, d_hidden) for i in range(n_layers))
        self.out_norm = nn.LayerNorm(d_hidden)

    @property
    def out_dim(self) -> int:
        return self.d_hidden

    def _mlp(self, x: th.Tensor) -> th.Tensor:
        """``(..., d_in)`` -> ``(..., d_hidden)``"""
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == 0 else layer(leaky_relu(x))
        return self.out_norm(x)

    def forward(self, x: th.Tensor, time_idx: th.Tensor, real: th.Tensor) -> th.Tensor:
        """:param x: ``(B, L, d_in)``; ``time_idx`` (unused); ``real`` ``(B, L)``
        :return: ``(B, L, d_hidden)``
        """
        return self._mlp(x.masked_fill(~real.unsqueeze(-1), 0.0))

    def init_state(self, n_envs: int, device: th.device | str, dtype: th.dtype = th.float32) -> FFState:
        return FFState(n_envs=n_envs)

    def reset_state(self, state: FFState, done: th.Tensor) -> FFState:
        return state

    def step(self, x: th.Tensor, time_idx: th.Tensor, state: FFState) -> tuple[th.Tensor, FFState]:
        """:param x: ``(N, d_in)`` -> ``(N, d_hidden)``"""
        return self._mlp(x), state
