"""AMAGO's timestep encoder: one observation plus the previous action -> one embedding, no memory.

Pipeline for a batch of windows ``(B, L)``::

    validate -> flatten to (B * L, ...) -> Discrete / MultiDiscrete values less the space's start
    -> zero padded rows -> running normalisation of non-image Box parts (float or integer)
    -> SB3 preprocess_obs -> features extractor -> concat [features, previous-action features]
    -> MLP (leaky ReLU) -> Linear(d_out) -> LayerNorm
"""

import functools
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.preprocessing import get_obs_shape, is_image_space, preprocess_obs
from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
from torch import nn
from torch.nn import functional as F

from sb3_amago.distributions import make_action_type
from sb3_amago.keys import ACHIEVED_KEY, INSTRUCTION_KEY, OBS_KEY
from sb3_amago.nets.activations import LeakyReLU
from sb3_amago.nets.cpu_matmul import Linear
from sb3_amago.nets.obs_extractors import NATURE_CNN_MIN_SIZE, AmagoExtractor, as_space_dict
from sb3_amago.type_aliases import TensorObs

OBS_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


class RunningNorm(nn.Module):
    """Running input normalisation with bias-corrected exponential moving statistics.

    Each training-mode call with at least one real row updates the mean and variance towards the
    real rows' batch statistics at rate ``beta / c_t``, where ``c_t = 1 - (1 - beta)^t`` after
    ``t`` updates: the same weighting as an EMA with rate ``beta`` started at zero and divided by
    ``c_t`` (Adam's bias correction), written so that the variance never needs ``E[x^2] - mean^2``.
    All statistics are float buffers; eval-mode calls leave them unchanged.

    :param shape: shape of one observation
    :param rate: EMA rate ``beta``
    :param eps: added to the variance
    :param clip: normalised values are clipped to ``[-clip, clip]``
    """

    mean: th.Tensor
    var: th.Tensor
    debias: th.Tensor

    def __init__(self, shape: tuple[int, ...], rate: float = 1e-4, eps: float = 1e-8, clip: float = 10.0) -> None:
        super().__init__()
        self.rate = rate
        self.eps = eps
        self.clip = clip
        self.register_buffer("mean", th.zeros(shape))
        self.register_buffer("var", th.ones(shape))
        self.register_buffer("debias", th.zeros(()))
        # Sums statistics over data-parallel ranks (set by sb3_amago.distributed; None in one process).
        self.reduce_moments: Callable[[th.Tensor], th.Tensor] | None = None

    @th.no_grad()
    def update(self, x: th.Tensor, real: th.Tensor) -> None:
        """With :attr:`reduce_moments` set, the batch statistics are those of all ranks' rows (the
        count and sum, then the squared deviations from their mean, are summed over the ranks).

        :param x: ``(N, *shape)`` in the buffers' dtype; ``real``: ``(N,)`` bool, rows to learn from
        """
        weight = real.to(x.dtype).view(-1, *([1] * (x.dim() - 1)))  # (N, 1, ...)
        n_real, total = weight.sum(), (x * weight).sum(0)
        if self.reduce_moments is not None:
            summed = self.reduce_moments(th.cat([n_real.reshape(1), total.reshape(-1)]))
            n_real, total = summed[0], summed[1:].view_as(total)
        batch_mean = total / n_real.clamp(min=1)
        squares = ((x - batch_mean) ** 2 * weight).sum(0)
        if self.reduce_moments is not None:
            squares = self.reduce_moments(squares)
        batch_var = squares / n_real.clamp(min=1)
        has_real = (n_real > 0).to(x.dtype)
        self.debias.add_(has_real * self.rate * (1.0 - self.debias))
        step = has_real * self.rate / self.debias.clamp(min=self.rate)
        delta = batch_mean - self.mean
        self.var.copy_((1 - step) * self.var + step * batch_var + step * (1 - step) * delta**2)
        self.mean.add_(step * delta)

    def forward(self, x: th.Tensor, real: th.Tensor) -> th.Tensor:
        """:param x: ``(N, *shape)``; ``real``: ``(N,)`` bool -> normalised ``(N, *shape)``"""
        x = x.to(self.mean.dtype)
        if self.training:
            self.update(x, real)
        return ((x - self.mean) / th.sqrt(self.var + self.eps)).clamp(-self.clip, self.clip)


def one_hot(x: th.Tensor, sizes: int | tuple[int, ...]) -> th.Tensor:
    """SB3's ``preprocess_obs`` of a Discrete (``sizes`` an int, ``x`` ``(N,)``) or 1-D MultiDiscrete
    (``x`` ``(N, len(sizes))``) observation counted from 0: float one-hot codes, ``(N, sum(sizes))``."""
    if isinstance(sizes, int):
        return F.one_hot(x.long(), num_classes=sizes).float()
    return th.cat([F.one_hot(x[:, i].long(), num_classes=n) for i, n in enumerate(sizes)], dim=-1).float()


def _as_float(x: th.Tensor) -> th.Tensor:
    return x.float()


def _image_as_float(x: th.Tensor) -> th.Tensor:
    return x.float() / 255.0


def observation_preprocessor(space: spaces.Space) -> Callable[[th.Tensor], th.Tensor]:
    """SB3's ``preprocess_obs`` for ``space``, with every decision about the space taken now: under
    torch.compile, reading gymnasium's numpy sizes and bounds in the update would turn them into
    tensors (an image check's branch, or a one-hot size that inductor's C++ wrapper cannot read back,
    breaks the graph). Spaces it does not cover (a 2-D MultiDiscrete) keep ``preprocess_obs``."""
    if isinstance(space, spaces.Discrete):
        return functools.partial(one_hot, sizes=int(space.n))
    if isinstance(space, spaces.MultiDiscrete) and space.nvec.ndim == 1:
        return functools.partial(one_hot, sizes=tuple(int(n) for n in space.nvec))
    if isinstance(space, spaces.Box) and is_image_space(space):
        return _image_as_float
    if isinstance(space, (spaces.Box, spaces.MultiBinary)):
        return _as_float
    return cast(Callable[[th.Tensor], th.Tensor], functools.partial(preprocess_obs, observation_space=space))


def _is_integer(dtype: th.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == th.bool)


def _is_uint8(dtype: th.dtype) -> bool:
    return dtype == th.uint8


def _is_real(dtype: th.dtype) -> bool:
    return not dtype.is_complex


def _is_float_or_integer(dtype: th.dtype) -> bool:
    return dtype.is_floating_point or _is_integer(dtype)


def _expected_dtype(space: spaces.Space) -> tuple[str, Callable[[th.dtype], bool]]:
    """A description of the accepted dtypes of one observation part and a predicate on ``th.dtype``
    (module-level functions: the encoder keeps them, and pickles)."""
    if is_image_space(space):
        return "uint8", _is_uint8
    if isinstance(space, spaces.MultiBinary):
        return "a bool, integer or float dtype", _is_real
    return "an integer or float dtype", _is_float_or_integer


#: The key under which models saved by sb3-amago 0.1.0 before the key names were unified kept the
#: running statistics of a non-Dict observation (now :data:`OBS_KEY`).
LEGACY_OBS_KEY = "obs"


def _rename_legacy_obs_norm(state_dict: dict[str, Any], prefix: str, *_args: Any) -> None:
    """Load hook: move a non-Dict observation's running statistics saved under :data:`LEGACY_OBS_KEY`
    to :data:`OBS_KEY`, so that models saved before the rename load unchanged."""
    old, new = f"{prefix}obs_norms.{LEGACY_OBS_KEY}.", f"{prefix}obs_norms.{OBS_KEY}."
    for key in [key for key in state_dict if key.startswith(old)]:
        state_dict[new + key[len(old) :]] = state_dict.pop(key)


class TimestepEncoder(nn.Module):
    """Embeds each timestep from its observation and the action that led to it.

    :param observation_space: a Box, Discrete, MultiDiscrete, MultiBinary or a Dict of these
    :param action_space: Discrete, MultiDiscrete or Box
    :param features_extractor_class: any SB3 ``BaseFeaturesExtractor``; it receives the observations
        preprocessed as SB3 policies give them, flattened to ``(B * L, ...)``. Default
        :class:`~sb3_amago.nets.obs_extractors.AmagoExtractor`
    :param features_extractor_kwargs: passed to the extractor's constructor
    :param d_out: embedding size
    :param hidden_sizes: MLP hidden layers
    :param normalize_obs: running normalisation of the non-image Box parts (float or integer)
    :param instruction_keys: Dict keys of goal-token sequences (for the default extractor)
    :param ignore_keys: Dict keys the policy never sees (dropped from the space and the input)
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        features_extractor_class: type[BaseFeaturesExtractor] | None = None,
        features_extractor_kwargs: dict[str, Any] | None = None,
        d_out: int = 256,
        hidden_sizes: Sequence[int] = (512, 512),
        normalize_obs: bool = True,
        instruction_keys: Sequence[str] = (INSTRUCTION_KEY,),
        ignore_keys: Sequence[str] = (ACHIEVED_KEY,),
    ) -> None:
        super().__init__()
        if isinstance(observation_space, spaces.Dict):
            observation_space = spaces.Dict({k: s for k, s in observation_space.spaces.items() if k not in ignore_keys})
        self.observation_space = observation_space
        self.action_space = action_space
        self.obs_spaces = as_space_dict(observation_space)
        for key, space in self.obs_spaces.items():
            if not isinstance(space, OBS_SPACES):
                raise ValueError(f"Observation '{key}': unsupported space {space}, expected one of {OBS_SPACES}")
        self.action_type = make_action_type(action_space)
        self.action_dim = self.action_type.action_dim
        self.obs_norms = nn.ModuleDict(
            {
                key: RunningNorm(space.shape)
                for key, space in self.obs_spaces.items()
                if normalize_obs and isinstance(space, spaces.Box) and not is_image_space(space)
            }
        )
        if not isinstance(observation_space, spaces.Dict):
            self._register_load_state_dict_pre_hook(_rename_legacy_obs_norm)
        # Discrete / MultiDiscrete values start at the space's ``start``; one-hot codes count from 0.
        self._start_buffers: dict[str, str] = {}
        for i, (key, space) in enumerate(self.obs_spaces.items()):
            if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)):
                start = np.asarray(space.start, dtype=np.int64).reshape(cast(tuple[int, ...], get_obs_shape(space)))
                self._start_buffers[key] = f"obs_start_{i}"
                self.register_buffer(self._start_buffers[key], th.as_tensor(start), persistent=False)
        # Decided per space now: the update (maybe compiled) reads no numpy bounds or sizes.
        self._preprocessors = {key: observation_preprocessor(space) for key, space in self.obs_spaces.items()}
        self._expected_dtypes = {key: _expected_dtype(space) for key, space in self.obs_spaces.items()}
        extractor_kwargs = dict(features_extractor_kwargs or {})
        if features_extractor_class is None:
            features_extractor_class = AmagoExtractor
            extractor_kwargs.setdefault("instruction_keys", tuple(instruction_keys))
        self.features_extractor = self._built_extractor(features_extractor_class, extractor_kwargs)
        layers: list[nn.Module] = []
        width = self.features_extractor.features_dim + self.action_features_dim
        for hidden in hidden_sizes:
            layers += [Linear(width, hidden), LeakyReLU()]
            width = hidden
        self.mlp = nn.Sequential(*layers, Linear(width, d_out), nn.LayerNorm(d_out))
        self.d_out = d_out

    def _built_extractor(self, extractor_class: type[BaseFeaturesExtractor], kwargs: dict[str, Any]) -> BaseFeaturesExtractor:
        """Build the features extractor; for image observations, also run it once on a blank batch
        (in eval mode) so that a CNN the images are too small for fails now, with the fix named,
        instead of at the first update.

        :raises ValueError: if the extractor cannot take the image sizes
        """
        images = {key: tuple(space.shape or ()) for key, space in self.obs_spaces.items() if is_image_space(space)}
        try:
            extractor = extractor_class(self.observation_space, **kwargs)
            if images:
                blank = {
                    key: self._preprocessors[key](th.zeros((2, *get_obs_shape(space)), dtype=th.long))
                    for key, space in self.obs_spaces.items()
                }
                training = extractor.training
                with th.no_grad():
                    extractor.eval()(blank if isinstance(self.observation_space, spaces.Dict) else blank[OBS_KEY])
                extractor.train(training)
        except RuntimeError as exc:
            if not images:
                raise
            raise ValueError(
                f"The features extractor {extractor_class.__name__} cannot take the image observations {images} ({exc}). "
                f"SB3's NatureCNN needs at least {NATURE_CNN_MIN_SIZE}x{NATURE_CNN_MIN_SIZE} pixels per image: for smaller "
                "images leave features_extractor_class unset (AMAGO's default extractor picks a CNN for every size) or give "
                "an extractor with smaller kernels and strides."
            ) from exc
        return extractor

    @property
    def action_features_dim(self) -> int:
        """Size of the previous-action features: the action encoding plus a "first step" flag."""
        return self.action_type.encoded_dim + 1

    def _validated_obs(self, obs: TensorObs, batch: int, length: int) -> dict[str, th.Tensor]:
        """Check every observation part; Discrete parts come back as ``(B, L, 1)``."""
        is_dict = isinstance(self.observation_space, spaces.Dict)
        if is_dict != isinstance(obs, dict):
            expected = "a dict of tensors" if is_dict else "a tensor"
            raise ValueError(f"Observation: expected {expected} for {self.observation_space}, received {type(obs)}")
        obs_dict = obs if isinstance(obs, dict) else {OBS_KEY: obs}
        out = {}
        for key, space in self.obs_spaces.items():
            if key not in obs_dict:
                raise ValueError(f"Observation key '{key}' is missing: expected keys {list(self.obs_spaces)}")
            x = obs_dict[key]
            shape = (1,) if isinstance(space, spaces.Discrete) else tuple(space.shape or ())
            accepted = [(batch, length, *shape)] + ([(batch, length)] if isinstance(space, spaces.Discrete) else [])
            if not isinstance(x, th.Tensor) or tuple(x.shape) not in accepted:
                received = tuple(x.shape) if isinstance(x, th.Tensor) else type(x)
                raise ValueError(
                    f"Observation '{key}' ({space}): expected shape {accepted[0]} (B, L, *obs_shape), received {received}"
                )
            dtype_desc, dtype_ok = self._expected_dtypes[key]
            if not dtype_ok(x.dtype):
                raise ValueError(f"Observation '{key}' ({space}): expected {dtype_desc}, received dtype {x.dtype}")
            out[key] = x.reshape(batch, length, *shape)
        return out

    def _check_inputs(self, prev_actions: th.Tensor, time_idx: th.Tensor, real: th.Tensor) -> None:
        batch, length = real.shape
        if tuple(prev_actions.shape) != (batch, length, self.action_dim):
            raise ValueError(
                f"prev_actions: expected shape {(batch, length, self.action_dim)} (B, L, action_dim), "
                f"received {tuple(prev_actions.shape)}"
            )
        if tuple(time_idx.shape) != (batch, length):
            raise ValueError(f"time_idx: expected shape {(batch, length)} (B, L), received {tuple(time_idx.shape)}")

    def action_features(self, prev_actions: th.Tensor, time_idx: th.Tensor) -> th.Tensor:
        """Features of the previous action, zero at the first step, plus a "first step" flag.

        :param prev_actions: ``(B, L, action_dim)`` in the buffer's representation
        :param time_idx: ``(B, L)``
        :return: ``(B, L, action_features_dim)`` float
        """
        first = (time_idx == 0).unsqueeze(-1)  # (B, L, 1)
        encoded = self.action_type.encode(prev_actions).float()  # (B, L, A)
        return th.cat([encoded.masked_fill(first, 0.0), first.float()], dim=-1)

    def forward(self, obs: TensorObs, prev_actions: th.Tensor, time_idx: th.Tensor, real: th.Tensor) -> th.Tensor:
        """:param obs: ``(B, L, *obs_shape)`` tensor or dict of them, in the raw dtypes
        :param prev_actions: ``(B, L, action_dim)`` float, the action that led to each step
        :param time_idx: ``(B, L)`` int64 global time index
        :param real: ``(B, L)`` bool, True for real steps
        :return: ``(B, L, d_out)``; padded rows are zero
        """
        batch, length = real.shape
        self._check_inputs(prev_actions, time_idx, real)
        obs_dict = self._validated_obs(obs, batch, length)
        real_rows = real.reshape(-1)  # (B * L,)
        flat: dict[str, th.Tensor] = {}
        embedding_dtype = next(self.mlp.parameters()).dtype
        for key, x in obs_dict.items():
            x = x.reshape(batch * length, *x.shape[2:])
            if key in self._start_buffers:
                x = x - self.get_buffer(self._start_buffers[key]).to(x.dtype)
            x = th.where(real_rows.view(-1, *([1] * (x.dim() - 1))), x, th.zeros((), dtype=x.dtype, device=x.device))
            if key in self.obs_norms:
                x = self.obs_norms[key](x, real_rows)
            processed = self._preprocessors[key](x)
            flat[key] = processed.to(embedding_dtype)
        extractor_input = flat if isinstance(self.observation_space, spaces.Dict) else flat[OBS_KEY]
        features = self.features_extractor(extractor_input).reshape(batch, length, -1)  # (B, L, F)
        actions = self.action_features(prev_actions, time_idx).to(features.dtype)  # (B, L, A + 1)
        out = self.mlp(th.cat([features, actions], dim=-1))  # (B, L, d_out)
        return out.masked_fill(~real.unsqueeze(-1), 0.0)
