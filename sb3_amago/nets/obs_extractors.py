"""Observation features extractors: the default one of AMAGO's timestep encoder and its parts.

Every extractor here is a Stable-Baselines3 ``BaseFeaturesExtractor``: it receives observations
preprocessed exactly as SB3 policies give them (``preprocess_obs``: images as floats in [0, 1],
Discrete / MultiDiscrete as one-hot vectors, MultiBinary as floats), flattened to ``(B, ...)``.
"""

from collections.abc import Sequence

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.preprocessing import (
    get_flattened_obs_dim,
    is_image_space,
    is_image_space_channels_first,
)
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor, NatureCNN
from torch import nn

from sb3_amago.keys import INSTRUCTION_KEY, OBS_KEY
from sb3_amago.nets.activations import LeakyReLU, leaky_relu
from sb3_amago.nets.cpu_matmul import Linear

CNN_TYPES = ("auto", "nature", "impala", "small")
# SB3's NatureCNN (8x8 stride 4, 4x4 stride 2, 3x3 stride 1 convolutions) needs this many pixels per side.
NATURE_CNN_MIN_SIZE = 36
# SmallImageCNN pools its feature maps down to at most this many cells per side before its linear layer.
SMALL_CNN_MAX_GRID = 8
SUMMARY_TYPES = ("gru", "mlp")


def as_space_dict(space: spaces.Space) -> dict[str, spaces.Space]:
    """The sub-spaces of a Dict space, or ``{OBS_KEY: space}`` for any other space."""
    if isinstance(space, spaces.Dict):
        return dict(space.spaces)
    return {OBS_KEY: space}


def channels_first_space(space: spaces.Box) -> spaces.Box:
    """The channel-first version of an image space (unchanged if it already is)."""
    if is_image_space_channels_first(space):
        return space
    return spaces.Box(low=np.transpose(space.low, (2, 0, 1)), high=np.transpose(space.high, (2, 0, 1)), dtype=space.dtype)


class _ResidualBlock(nn.Module):
    """``x + conv(relu(conv(relu(x))))`` with 3x3 convolutions that keep the shape."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv_1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.conv_2 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x: th.Tensor) -> th.Tensor:
        """``(B, C, H, W)`` -> ``(B, C, H, W)``"""
        return x + self.conv_2(leaky_relu(self.conv_1(leaky_relu(x, 0.0)), 0.0))


class ImpalaCNN(BaseFeaturesExtractor):
    """IMPALA's residual CNN (Espeholt et al. 2018) for channel-first images.

    Each stage: 3x3 convolution, 3x3 max-pool with stride 2, two residual blocks. Then ReLU, a
    linear layer to ``features_dim`` and ReLU.

    :param observation_space: channel-first image space ``(C, H, W)``
    :param features_dim: output size
    :param channels: output channels of each stage
    """

    def __init__(self, observation_space: spaces.Box, features_dim: int = 256, channels: Sequence[int] = (16, 32, 32)) -> None:
        super().__init__(observation_space, features_dim)
        layers: list[nn.Module] = []
        in_channels = observation_space.shape[0]
        for out_channels in channels:
            layers += [
                nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1),
                nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
                _ResidualBlock(out_channels),
                _ResidualBlock(out_channels),
            ]
            in_channels = out_channels
        self.cnn = nn.Sequential(*layers, LeakyReLU(0.0), nn.Flatten())
        with th.no_grad():
            n_flatten = self.cnn(th.zeros(1, *observation_space.shape)).shape[1]
        self.linear = nn.Sequential(Linear(n_flatten, features_dim), LeakyReLU(0.0))

    def forward(self, observations: th.Tensor) -> th.Tensor:
        """``(B, C, H, W)`` -> ``(B, features_dim)``"""
        return self.linear(self.cnn(observations))


class SmallImageCNN(BaseFeaturesExtractor):
    """A CNN for images too small for NatureCNN, e.g. grid-world views of a few cells per side.

    3x3 convolutions with stride 1 and padding 1 (each followed by ReLU) keep every pixel, an
    adaptive max-pool brings grids larger than ``SMALL_CNN_MAX_GRID`` per side down to it (smaller
    grids pass unchanged), then a linear layer to ``features_dim`` and ReLU. Any size from 1x1 works.

    :param observation_space: channel-first image space ``(C, H, W)``
    :param features_dim: output size
    :param channels: output channels of each convolution
    """

    def __init__(self, observation_space: spaces.Box, features_dim: int = 256, channels: Sequence[int] = (32, 64, 64)) -> None:
        super().__init__(observation_space, features_dim)
        in_channels, height, width = observation_space.shape
        layers: list[nn.Module] = []
        for out_channels in channels:
            layers += [nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1), LeakyReLU(0.0)]
            in_channels = out_channels
        grid = (min(height, SMALL_CNN_MAX_GRID), min(width, SMALL_CNN_MAX_GRID))
        self.cnn = nn.Sequential(*layers, nn.AdaptiveMaxPool2d(grid), nn.Flatten())
        self.linear = nn.Sequential(Linear(in_channels * grid[0] * grid[1], features_dim), LeakyReLU(0.0))

    def forward(self, observations: th.Tensor) -> th.Tensor:
        """``(B, C, H, W)`` -> ``(B, features_dim)``"""
        return self.linear(self.cnn(observations))


def pick_cnn(cnn: str, space: spaces.Box) -> str:
    """Resolve ``cnn`` for a channel-first image space: ``"auto"`` is NatureCNN from
    ``NATURE_CNN_MIN_SIZE`` pixels per side and :class:`SmallImageCNN` below.

    :raises ValueError: for an unknown name, or ``"nature"`` with an image too small for it
    """
    if cnn not in CNN_TYPES:
        raise ValueError(f"Unknown cnn '{cnn}', expected one of {CNN_TYPES}")
    height, width = space.shape[1:]
    if cnn == "auto":
        return "nature" if min(height, width) >= NATURE_CNN_MIN_SIZE else "small"
    if cnn == "nature" and min(height, width) < NATURE_CNN_MIN_SIZE:
        raise ValueError(
            f"cnn='nature' (SB3's NatureCNN) needs images of at least {NATURE_CNN_MIN_SIZE}x{NATURE_CNN_MIN_SIZE} pixels, "
            f"got {height}x{width}: use cnn='auto' or 'small' (3x3 stride-1 convolutions) or 'impala' in "
            "policy_kwargs=dict(features_extractor_kwargs=dict(cnn=...))."
        )
    return cnn


class ImageEncoder(nn.Module):
    """A CNN over SB3-preprocessed images (floats in [0, 1]), rescaled to [-1, 1] first.

    Channel-last images are transposed to channel-first.

    :param space: uint8 image space, channel-first or channel-last, of any size
    :param cnn: ``"auto"`` (NatureCNN from 36x36 pixels, :class:`SmallImageCNN` below), ``"nature"``
        (SB3's NatureCNN), ``"impala"`` (:class:`ImpalaCNN`) or ``"small"`` (:class:`SmallImageCNN`)
    :param features_dim: output size
    """

    def __init__(self, space: spaces.Box, cnn: str = "auto", features_dim: int = 256) -> None:
        super().__init__()
        self.channels_last = not is_image_space_channels_first(space)
        cnn_space = channels_first_space(space)
        cnn_classes: dict[str, type[BaseFeaturesExtractor]] = {
            "nature": NatureCNN,
            "impala": ImpalaCNN,
            "small": SmallImageCNN,
        }
        self.cnn = cnn_classes[pick_cnn(cnn, cnn_space)](cnn_space, features_dim)
        self.features_dim = features_dim

    def forward(self, images: th.Tensor) -> th.Tensor:
        """``(B, C, H, W)`` or ``(B, H, W, C)`` in [0, 1] -> ``(B, features_dim)``"""
        if self.channels_last:
            images = images.permute(0, 3, 1, 2)
        return self.cnn(images * 2.0 - 1.0)


class InstructionEncoder(nn.Module):
    """Embeds a sequence of integer goal tokens (0 = empty slot) and summarises it.

    Takes SB3's preprocessed form of a MultiDiscrete observation (concatenated one-hot vectors),
    recovers the token indices, looks them up in an ``nn.Embedding`` and summarises the sequence
    with a GRU (its last hidden state) or an MLP over the concatenated embeddings.

    :param space: ``MultiDiscrete`` with one entry per goal slot
    :param token_dim: size of each token embedding
    :param summary: ``"gru"`` or ``"mlp"``
    :param features_dim: output size
    """

    def __init__(self, space: spaces.MultiDiscrete, token_dim: int = 32, summary: str = "gru", features_dim: int = 64) -> None:
        super().__init__()
        if summary not in SUMMARY_TYPES:
            raise ValueError(f"Unknown instruction summary '{summary}', expected one of {SUMMARY_TYPES}")
        self.nvec = [int(n) for n in np.asarray(space.nvec).reshape(-1)]
        self.embedding = nn.Embedding(max(self.nvec), token_dim)
        if summary == "gru":
            self.summary: nn.Module = nn.GRU(token_dim, features_dim, batch_first=True)
        else:
            self.summary = nn.Sequential(Linear(len(self.nvec) * token_dim, features_dim), LeakyReLU())
        self.features_dim = features_dim

    def forward(self, one_hot: th.Tensor) -> th.Tensor:
        """``(B, sum(nvec))`` concatenated one-hot tokens -> ``(B, features_dim)``"""
        tokens = th.stack([part.argmax(dim=1) for part in th.split(one_hot, self.nvec, dim=1)], dim=1)  # (B, k)
        emb = self.embedding(tokens)  # (B, k, token_dim)
        if isinstance(self.summary, nn.GRU):
            dtype = self.summary.weight_ih_l0.dtype
            return self.summary(emb.to(dtype))[1][-1]
        return self.summary(emb.flatten(1))


class AmagoExtractor(BaseFeaturesExtractor):
    """Default features extractor of AMAGO's timestep encoder, for Box or Dict observation spaces.

    Per key: uint8 images of any size through a CNN (inputs rescaled to [-1, 1]), MultiDiscrete keys named in
    ``instruction_keys`` through an :class:`InstructionEncoder`, everything else (float Box,
    one-hot Discrete / MultiDiscrete, MultiBinary) flattened; the results are concatenated.

    :param observation_space: a Box, Discrete, MultiDiscrete, MultiBinary or a Dict of these
    :param cnn: ``"auto"``, ``"nature"``, ``"impala"`` or ``"small"`` (see :class:`ImageEncoder`)
    :param cnn_features_dim: output size of each image's CNN
    :param instruction_keys: Dict keys holding goal-token sequences
    :param token_dim: size of each goal-token embedding
    :param instruction_summary: ``"gru"`` or ``"mlp"``
    :param instruction_dim: output size of each instruction summary
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        cnn: str = "auto",
        cnn_features_dim: int = 256,
        instruction_keys: Sequence[str] = (INSTRUCTION_KEY,),
        token_dim: int = 32,
        instruction_summary: str = "gru",
        instruction_dim: int = 64,
    ) -> None:
        super().__init__(observation_space, features_dim=1)
        self.is_dict = isinstance(observation_space, spaces.Dict)
        encoders: dict[str, nn.Module] = {}
        total = 0
        for key, space in as_space_dict(observation_space).items():
            if isinstance(space, spaces.Box) and is_image_space(space):
                encoders[key] = ImageEncoder(space, cnn, cnn_features_dim)
                total += cnn_features_dim
            elif self.is_dict and key in instruction_keys and isinstance(space, spaces.MultiDiscrete):
                encoders[key] = InstructionEncoder(space, token_dim, instruction_summary, instruction_dim)
                total += instruction_dim
            else:
                encoders[key] = nn.Flatten()
                total += int(get_flattened_obs_dim(space))
        self.encoders = nn.ModuleDict(encoders)
        self._features_dim = total

    def forward(self, observations: th.Tensor | dict[str, th.Tensor]) -> th.Tensor:
        """Preprocessed observations ``(B, ...)`` (or a dict of them) -> ``(B, features_dim)``"""
        obs = observations if isinstance(observations, dict) else {OBS_KEY: observations}
        return th.cat([encoder(obs[key]) for key, encoder in self.encoders.items()], dim=1)
