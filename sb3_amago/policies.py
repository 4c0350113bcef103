"""TransformerPolicy: timestep encoder + one shared trajectory encoder + actor and critic heads.

The policy owns every network AMAGO trains and the EMA target copies of the heads (there is no
target copy of the sequence model). Acting carries a per-env context, :class:`AmagoState`, that
``predict`` hands back to the caller the way sb3-contrib's RecurrentPPO hands back LSTM states.
"""

import copy
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.preprocessing import get_obs_shape, is_image_space
from stable_baselines3.common.type_aliases import PyTorchObs, Schedule

from sb3_amago.distributions import ActorOutput, make_action_type
from sb3_amago.keys import OBS_KEY, PREV_REWARD_KEY, TRIAL_RESET_KEY
from sb3_amago.nets import TrajEncoder, TransformerTrajEncoder, traj_encoder_class
from sb3_amago.nets.heads import ActorHead
from sb3_amago.nets.popart import PopArt
from sb3_amago.nets.timestep import TimestepEncoder
from sb3_amago.type_aliases import TensorObs
from sb3_amago.validation import check_finite
from sb3_amago.wrappers import flat_dict_obs


@dataclass
class AmagoState:
    """What one batch of ``N`` envs carries between ``predict`` calls.

    encoder_state: the trajectory encoder's per-env state (key/value cache, hidden vector, ...)
    prev_action: ``(N, action_dim)`` the last action taken, in the replay buffer's representation
    time_idx: ``(N,)`` int64, the time index of the next observation within its rollout
    spent: True once ``predict`` has advanced from this state. The sequence model's cache is
        updated in place (copying it every step would cost as much as the step), so a spent state
        no longer describes its envs and ``predict`` refuses it; ``copy.deepcopy`` a state to
        branch from it.
    """

    encoder_state: Any
    prev_action: th.Tensor
    time_idx: th.Tensor
    spent: bool = field(default=False, init=False, compare=False)

    @property
    def n_envs(self) -> int:
        return self.time_idx.shape[0]


class TransformerPolicy(BasePolicy):
    """AMAGO's actor-critic over a shared causal sequence model.

    :param observation_space: what the policy sees (for goal envs: without the achieved-goal key)
    :param action_space: Discrete, MultiDiscrete or Box
    :param lr_schedule: learning-rate schedule
    :param gammas: discount factors, the main one last (the policy acts with the last head)
    :param max_seq_len: training window length
    :param n_critics: critics in the ensemble
    :param traj_encoder: "transformer", "gru", "ff", or a :class:`~sb3_amago.nets.TrajEncoder` subclass
    :param traj_encoder_kwargs: sizes of the sequence model (e.g. ``d_model``, ``n_layers``)
    :param d_embed: size of each timestep embedding
    :param timestep_encoder_kwargs: e.g. ``hidden_sizes``, ``normalize_obs``, ``instruction_keys``
    :param features_extractor_class: an SB3 features extractor for the observation part of the
        timestep encoder (default: the package's own, which handles Box, Dict, images, tokens)
    :param features_extractor_kwargs: its keyword arguments
    :param net_arch: SB3's off-policy ``net_arch``: a list of hidden sizes for the actor and each
        critic, or ``dict(pi=[...], qf=[...])`` for each separately (instead of ``actor_hidden`` /
        ``critic_hidden``)
    :param actor_hidden: hidden sizes of the actor MLP (default ``(256, 256)``)
    :param critic_hidden: hidden sizes of each critic MLP (default ``(256, 256)``)
    :param popart_kwargs: options of :class:`sb3_amago.nets.popart.PopArt` (``beta``, ``init_nu``,
        ``trainable``, ``bias_correction``)
    :param optimizer_class: optimizer of all online parameters (one optimizer, one loss)
    :param optimizer_kwargs: its keyword arguments (default ``weight_decay=1e-3``, and the fused
        implementation where the optimizer has one, see :func:`default_optimizer_kwargs`)
    :param normalize_images: SB3's: False says the image observations come normalized already. The
        timestep encoder scales uint8 images to [0, 1] whatever it says, so False is refused for an
        observation holding uint8 images; float observations are used as they are either way
    """

    gamma_values: th.Tensor

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Schedule,
        gammas: tuple[float, ...] = (0.1, 0.9, 0.95, 0.97, 0.99, 0.995, 0.999),
        max_seq_len: int = 64,
        n_critics: int = 4,
        traj_encoder: str | type[TrajEncoder] = "transformer",
        traj_encoder_kwargs: dict[str, Any] | None = None,
        d_embed: int = 256,
        timestep_encoder_kwargs: dict[str, Any] | None = None,
        features_extractor_class: type | None = None,
        features_extractor_kwargs: dict[str, Any] | None = None,
        net_arch: list[int] | dict[str, list[int]] | None = None,
        actor_hidden: tuple[int, ...] | None = None,
        critic_hidden: tuple[int, ...] | None = None,
        popart_kwargs: dict[str, Any] | None = None,
        optimizer_class: type[th.optim.Optimizer] = th.optim.AdamW,
        optimizer_kwargs: dict[str, Any] | None = None,
        normalize_images: bool = True,
    ) -> None:
        if optimizer_kwargs is None:
            optimizer_kwargs = default_optimizer_kwargs(optimizer_class)
        if features_extractor_class is None:
            features_extractor_kwargs = default_extractor_kwargs(features_extractor_kwargs or {})
        if not normalize_images:
            check_images_need_no_scaling(observation_space)
        action_type = make_action_type(action_space)
        super().__init__(
            observation_space,
            action_space,
            features_extractor_class=features_extractor_class,
            features_extractor_kwargs=features_extractor_kwargs,
            optimizer_class=optimizer_class,
            optimizer_kwargs=optimizer_kwargs,
            # SB3 reads normalize_images=False to pass normalized_image=True to its NatureCNN or
            # CombinedExtractor, from the class given; AMAGO's default extractor (None) needs no such word.
            normalize_images=normalize_images or features_extractor_class is None,
            squash_output=action_type.squash_output,
        )
        self.normalize_images = normalize_images
        self.action_type = action_type
        self.gammas = tuple(float(g) for g in gammas)
        self.max_seq_len = max_seq_len
        self.n_critics = n_critics
        self.traj_encoder_class = traj_encoder_class(traj_encoder)
        self.traj_encoder_kwargs = dict(traj_encoder_kwargs or {})
        self.d_embed = d_embed
        self.timestep_encoder_kwargs = dict(timestep_encoder_kwargs or {})
        self.actor_hidden, self.critic_hidden = head_sizes(net_arch, actor_hidden, critic_hidden)
        self.popart_kwargs = dict(popart_kwargs or {})
        self._check_position_table()
        self._build(lr_schedule)

    def _check_position_table(self) -> None:
        """A learnable position table must cover the time indices of a whole training window."""
        kwargs = self.traj_encoder_kwargs
        max_time = kwargs.get("max_time")
        learnable = issubclass(self.traj_encoder_class, TransformerTrajEncoder) and kwargs.get("pos_emb") == "learnable"
        if learnable and max_time is not None and max_time < self.max_seq_len + 1:
            raise ValueError(
                f"policy_kwargs traj_encoder_kwargs max_time={max_time} (the learnable position table's rows) is "
                f"smaller than a training window (max_seq_len + 1 = {self.max_seq_len + 1} time indices): raise "
                "max_time to the longest rollout, at least max_seq_len + 1, or lower max_seq_len."
            )

    def _build(self, lr_schedule: Schedule) -> None:
        self.timestep_encoder = TimestepEncoder(
            self.observation_space,
            self.action_space,
            features_extractor_class=self.features_extractor_class,
            features_extractor_kwargs=self.features_extractor_kwargs,
            d_out=self.d_embed,
            **self.timestep_encoder_kwargs,
        )
        # Training windows hold max_seq_len + 1 steps (the last one only bootstraps), and acting
        # keeps the same context length so that both see the same windows.
        self.traj_encoder = self.traj_encoder_class(self.d_embed, self.max_seq_len + 1, **self.traj_encoder_kwargs)
        state_dim = self.traj_encoder.out_dim
        n_gammas = len(self.gammas)
        self.actor = ActorHead(state_dim, self.action_type, n_gammas, self.actor_hidden)
        self.critics = self.action_type.make_critics(state_dim, th.tensor(self.gammas), self.n_critics, self.critic_hidden)
        self.popart = PopArt(n_gammas, **self.popart_kwargs)
        self.register_buffer("gamma_values", th.tensor(self.gammas, dtype=th.float32))
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critics_target = copy.deepcopy(self.critics).requires_grad_(False)
        # Any torch optimizer that takes lr, as SB3 builds its policies' optimizers.
        self.optimizer = self.optimizer_class(self.online_parameters(), lr=lr_schedule(1), **self.optimizer_kwargs)  # type: ignore[call-arg]

    def online_parameters(self) -> list[th.nn.Parameter]:
        """Every trained parameter (all but the EMA target heads)."""
        return [p for name, p in self.named_parameters() if not name.startswith(("actor_target.", "critics_target."))]

    @th.no_grad()
    def update_targets(self, tau: float) -> None:
        """EMA of the actor and critic heads into their targets, in one fused op per group."""
        for online, target in ((self.actor, self.actor_target), (self.critics, self.critics_target)):
            th._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(
            lr_schedule=self._dummy_schedule,
            optimizer_class=self.optimizer_class,
            optimizer_kwargs=self.optimizer_kwargs,
            gammas=self.gammas,
            max_seq_len=self.max_seq_len,
            n_critics=self.n_critics,
            traj_encoder=self.traj_encoder_class,
            traj_encoder_kwargs=self.traj_encoder_kwargs,
            d_embed=self.d_embed,
            timestep_encoder_kwargs=self.timestep_encoder_kwargs,
            features_extractor_class=self.features_extractor_class,
            features_extractor_kwargs=self.features_extractor_kwargs,
            actor_hidden=self.actor_hidden,
            critic_hidden=self.critic_hidden,
            popart_kwargs=self.popart_kwargs,
        )
        return data

    # ----------------------------------------------------------------------------------------
    # Training-side forward
    # ----------------------------------------------------------------------------------------
    def encode(self, obs: TensorObs, prev_actions: th.Tensor, time_idx: th.Tensor, real: th.Tensor) -> th.Tensor:
        """Whole windows -> states ``(B, L, D)``: one pass of the shared sequence model."""
        emb = self.timestep_encoder(obs, prev_actions, time_idx, real)  # (B, L, d_embed)
        return self.traj_encoder(emb, time_idx, real)

    # ----------------------------------------------------------------------------------------
    # Acting
    # ----------------------------------------------------------------------------------------
    def initial_state(self, n_envs: int) -> AmagoState:
        """A fresh context for ``n_envs`` envs (no step seen)."""
        return AmagoState(
            encoder_state=self.traj_encoder.init_state(n_envs, self.device),
            prev_action=th.zeros(n_envs, self.action_type.action_dim, device=self.device),
            time_idx=th.zeros(n_envs, dtype=th.long, device=self.device),
        )

    def reset_state(self, state: AmagoState, done: th.Tensor | np.ndarray) -> AmagoState:
        """Start a new rollout for the envs where ``done`` is True; the others keep their context."""
        done = th.as_tensor(np.asarray(done, dtype=bool).reshape(-1), device=self.device)
        if done.shape[0] != state.n_envs:
            raise ValueError(f"episode_start has {done.shape[0]} entries but the state holds {state.n_envs} envs")
        if not bool(done.any()):
            return state
        keep = (~done).unsqueeze(-1).to(state.prev_action.dtype)
        return AmagoState(
            encoder_state=self.traj_encoder.reset_state(state.encoder_state, done),
            prev_action=state.prev_action * keep,
            time_idx=th.where(done, th.zeros_like(state.time_idx), state.time_idx),
        )

    def observe(self, obs: TensorObs, state: AmagoState) -> tuple[Any, AmagoState]:
        """Embed one new observation per env and advance the sequence model's context.

        :param obs: ``(N, *obs_shape)`` tensors (buffer layout)
        :return: the main-gamma actor output for each env and the state (its ``prev_action`` and
            ``time_idx`` still describe this step until :meth:`commit_action`)
        """
        ones = th.ones(state.n_envs, 1, dtype=th.bool, device=self.device)
        seq_obs = {k: v.unsqueeze(1) for k, v in obs.items()} if isinstance(obs, dict) else obs.unsqueeze(1)
        emb = self.timestep_encoder(seq_obs, state.prev_action.unsqueeze(1), state.time_idx.unsqueeze(1), ones)
        hidden, encoder_state = self.traj_encoder.step(emb[:, 0], state.time_idx, state.encoder_state)
        return self.action_type.select_gamma(self.actor(hidden), -1), replace(state, encoder_state=encoder_state)

    def commit_action(self, state: AmagoState, action: th.Tensor) -> AmagoState:
        """Record the action taken (buffer representation ``(N, action_dim)``) and move time on."""
        return replace(state, prev_action=action.to(state.prev_action.dtype), time_idx=state.time_idx + 1)

    def select_action(self, actor_out: ActorOutput, deterministic: bool) -> th.Tensor:
        """Actor output for one gamma -> actions in the buffer representation ``(N, action_dim)``."""
        return self.action_type.sample(actor_out, deterministic)

    def to_env_action(self, buffer_action: th.Tensor) -> np.ndarray:
        """Buffer representation -> what ``env.step`` takes: ``(N,)`` ints, ``(N, d)`` ints, or Box values."""
        return self.action_type.to_env(buffer_action.cpu().numpy())

    def prepare_observation(self, observation: Any) -> Any:
        """Accept observations as the user's env emits them: tuples and nested dicts are flattened
        as AMAGO flattens their spaces (:func:`sb3_amago.wrappers.flat_dict_space`), extra keys
        (the achieved goal) are dropped, missing context keys raise a clear error."""
        if not isinstance(self.observation_space, spaces.Dict):
            return observation
        if isinstance(observation, (tuple, Mapping)):
            observation = flat_dict_obs(observation)
        if not isinstance(observation, dict):
            raise ValueError(
                f"This model takes Dict observations with keys {sorted(self.observation_space.spaces)}, got {type(observation).__name__}."
            )
        missing = [k for k in self.observation_space.spaces if k not in observation]
        if missing:
            hint = ""
            if PREV_REWARD_KEY in missing or TRIAL_RESET_KEY in missing:
                hint = (
                    " The model was trained with context inputs in its observations: wrap the env the same way as in "
                    "training (e.g. sb3_amago.PrevRewardWrapper for 'prev_reward', the trials wrapper for 'trial_reset')."
                )
            raise ValueError(f"Observation lacks the key(s) {missing} the model was trained with.{hint}")
        return {k: observation[k] for k in self.observation_space.spaces}

    def obs_to_buffer_layout(self, obs: PyTorchObs) -> TensorObs:
        """Reshape each observation tensor to ``(N, *buffer_obs_shape)`` (e.g. Discrete -> ``(N, 1)``)."""
        if isinstance(obs, dict):
            assert isinstance(self.observation_space, spaces.Dict)
            return {k: v.reshape(v.shape[0], *get_obs_shape(self.observation_space[k])) for k, v in obs.items()}
        return obs.reshape(obs.shape[0], *get_obs_shape(self.observation_space))

    def env_obs_to_tensor(self, observation: Any) -> tuple[TensorObs, bool]:
        """Raw env observations -> finite tensors in the buffer layout, and whether they were batched."""
        observation = self.prepare_observation(observation)
        for key, value in observation.items() if isinstance(observation, dict) else [(OBS_KEY, observation)]:
            check_finite(f"Observation '{key}'", np.asarray(value))
        obs_tensor, vectorized = self.obs_to_tensor(observation)
        return self.obs_to_buffer_layout(obs_tensor), vectorized

    def predict(  # type: ignore[override]
        self,
        observation: np.ndarray | dict[str, np.ndarray],
        state: AmagoState | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray, AmagoState]:
        """Act on raw env observations, carrying each env's context in ``state``.

        :param observation: one observation or a batch of ``N`` (vectorised env)
        :param state: the state returned by the previous call; ``None`` starts fresh contexts. The
            call advances the context in place: the state passed in is spent (see :class:`AmagoState`)
        :param episode_start: ``(N,)`` bool, envs whose rollout starts with this observation
        :param deterministic: act with the mode of the main-gamma policy
        :return: actions in the env's format, and the state to pass next time
        :raises ValueError: for a state already passed to an earlier call
        """
        self.set_training_mode(False)
        if (
            isinstance(observation, tuple)
            and len(observation) == 2
            and isinstance(observation[1], dict)
            and not self._is_observation(observation)
        ):
            raise ValueError(
                "predict() got an (observation, info) tuple: you are probably mixing Gym API with SB3 VecEnv API "
                "(`obs, info = env.reset()` for a gymnasium env vs `obs = vec_env.reset()` for a VecEnv)."
            )
        obs_tensor, vectorized = self.env_obs_to_tensor(observation)
        n_envs = batch_size(obs_tensor)
        if state is None:
            state = self.initial_state(n_envs)
        elif not isinstance(state, AmagoState) or state.n_envs != n_envs:
            raise ValueError(
                "state must be None or the AmagoState returned by the previous predict call for the same number of envs "
                f"({n_envs} observations given)."
            )
        elif state.spent:
            raise ValueError(
                "This state was already passed to predict, which advanced its context in place: pass the state returned "
                "by the latest predict call (copy.deepcopy a state before the call to act twice from the same context)."
            )
        else:
            state.spent = True
        if episode_start is not None:
            state = self.reset_state(state, episode_start)
        with th.no_grad():
            actor_out, state = self.observe(obs_tensor, state)
            action = self.select_action(actor_out, deterministic)
            state = self.commit_action(state, action)
        env_action = self.to_env_action(action)
        if not vectorized:
            env_action = env_action.squeeze(axis=0)
        return env_action, state

    def _is_observation(self, value: tuple) -> bool:
        """Whether a tuple is an observation of this model's space (a Tuple observation, flattened)."""
        return isinstance(self.observation_space, spaces.Dict) and set(flat_dict_obs(value)) >= set(
            self.observation_space.spaces
        )

    def _predict(self, observation: PyTorchObs, deterministic: bool = False) -> th.Tensor:
        """Action for a first observation with no context (SB3's stateless interface)."""
        obs = self.obs_to_buffer_layout(observation)
        actor_out, _ = self.observe(obs, self.initial_state(batch_size(obs)))
        return self.select_action(actor_out, deterministic)


def default_optimizer_kwargs(optimizer_class: type[th.optim.Optimizer]) -> dict[str, Any]:
    """AdamW's weight decay of the paper (1e-3), with the optimizer's fused kernel where it has one
    (AdamW, Adam: one kernel for every parameter, about a fifth of the multi-tensor step's time on a
    CPU), else its multi-tensor (``foreach``) implementation where it has that."""
    accepted = inspect.signature(optimizer_class).parameters
    kwargs: dict[str, Any] = {"weight_decay": 1e-3} if "weight_decay" in accepted else {}
    if "fused" in accepted:
        kwargs["fused"] = True
    elif "foreach" in accepted:
        kwargs["foreach"] = True
    return kwargs


def batch_size(obs: TensorObs) -> int:
    """Leading (env) dimension of an observation tensor or dict of tensors."""
    return next(iter(obs.values())).shape[0] if isinstance(obs, dict) else obs.shape[0]


def head_sizes(
    net_arch: list[int] | dict[str, list[int]] | None,
    actor_hidden: tuple[int, ...] | None,
    critic_hidden: tuple[int, ...] | None,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Hidden sizes of the actor and of each critic, from SB3's ``net_arch`` (a list for both, or
    ``dict(pi=..., qf=...)``, as SAC / TD3 read it) or from ``actor_hidden`` / ``critic_hidden``."""
    if net_arch is None:
        default = (256, 256)
        actor_hidden = default if actor_hidden is None else actor_hidden
        return tuple(actor_hidden), tuple(default if critic_hidden is None else critic_hidden)
    if actor_hidden is not None or critic_hidden is not None:
        raise ValueError("Give the head sizes as net_arch (SB3's meaning) or as actor_hidden / critic_hidden, not both.")
    if isinstance(net_arch, dict):
        if set(net_arch) != {"pi", "qf"}:
            raise ValueError(f"A dict net_arch needs exactly the keys 'pi' (actor) and 'qf' (critics), got {sorted(net_arch)}")
        return tuple(net_arch["pi"]), tuple(net_arch["qf"])
    return tuple(net_arch), tuple(net_arch)


# SB3's names for the image-feature size of its default extractors: CombinedExtractor (Dict
# observations) calls it cnn_output_dim, NatureCNN (image observations) features_dim.
SB3_CNN_DIM_KWARGS = ("cnn_output_dim", "features_dim")


def check_images_need_no_scaling(observation_space: spaces.Space) -> None:
    """Refuse ``normalize_images=False`` for an observation holding uint8 images, which the timestep
    encoder scales to [0, 1] (SB3's preprocessing) all the same."""
    parts = observation_space.spaces if isinstance(observation_space, spaces.Dict) else {OBS_KEY: observation_space}
    images = [key for key, space in parts.items() if is_image_space(space)]
    if images:
        raise ValueError(
            f"normalize_images=False, but the observation {images} holds uint8 images, which AMAGO's timestep encoder "
            "scales to [0, 1] itself: leave normalize_images=True, or give the images as floats (already normalized, "
            "e.g. after VecNormalize), which AMAGO uses as they are."
        )


def default_extractor_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``features_extractor_kwargs`` for AMAGO's default extractor, SB3's names for the image-feature
    size (see ``SB3_CNN_DIM_KWARGS``) renamed to its ``cnn_features_dim``."""
    given = [key for key in (*SB3_CNN_DIM_KWARGS, "cnn_features_dim") if key in kwargs]
    if len(given) > 1:
        raise ValueError(f"features_extractor_kwargs gives the image-feature size twice: {given}")
    return {("cnn_features_dim" if key in SB3_CNN_DIM_KWARGS else key): value for key, value in kwargs.items()}
