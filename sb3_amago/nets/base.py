"""The interface every trajectory encoder (sequence model) implements.

A trajectory encoder maps a sequence of timestep embeddings to a sequence of states, causally.
It runs two ways that must agree to float precision:

* ``forward``: the whole padded batch at once (training), shapes ``(B, L, ...)``.
* ``step``: one new timestep for each of ``N`` parallel envs (acting), carrying a per-env state
  (a key/value cache, a hidden vector, ...) between calls.
"""

from abc import ABC, abstractmethod
from typing import Any

import torch as th
from torch import nn


class TrajEncoder(nn.Module, ABC):
    """Causal sequence model over timestep embeddings.

    :param d_in: size of each timestep embedding
    :param max_seq_len: longest window seen in training; acting past it slides the context
    """

    def __init__(self, d_in: int, max_seq_len: int) -> None:
        super().__init__()
        if max_seq_len < 1:
            raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
        self.d_in = d_in
        self.max_seq_len = max_seq_len

    @property
    @abstractmethod
    def out_dim(self) -> int:
        """Size of each output state."""

    @abstractmethod
    def forward(self, x: th.Tensor, time_idx: th.Tensor, real: th.Tensor) -> th.Tensor:
        """Full-sequence pass.

        :param x: timestep embeddings ``(B, L, d_in)``
        :param time_idx: global time index of each step in its rollout ``(B, L)`` (int64)
        :param real: ``(B, L)`` bool, True where the step is real; padding is on the right
        :return: states ``(B, L, out_dim)``; padded positions hold unspecified finite values
        """

    @abstractmethod
    def init_state(self, n_envs: int, device: th.device | str, dtype: th.dtype = th.float32) -> Any:
        """An empty per-env state for ``n_envs`` envs (no steps seen yet)."""

    @abstractmethod
    def reset_state(self, state: Any, done: th.Tensor) -> Any:
        """Clear the context of the envs where ``done`` (``(N,)`` bool) is True; others are kept."""

    @abstractmethod
    def step(self, x: th.Tensor, time_idx: th.Tensor, state: Any) -> tuple[th.Tensor, Any]:
        """One new timestep per env.

        :param x: ``(N, d_in)``
        :param time_idx: ``(N,)`` global time index of this step
        :param state: from ``init_state`` / a previous ``step``
        :return: ``(N, out_dim)`` states and the new per-env state
        """
