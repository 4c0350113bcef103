"""Checks of AMAGO's constructor arguments: each raises a ValueError naming the argument and the fix,
at construction rather than at the first update."""

import inspect
import warnings
from collections.abc import Mapping
from typing import Any

from gymnasium import spaces
from stable_baselines3.common.noise import ActionNoise
from stable_baselines3.her.her_replay_buffer import HerReplayBuffer

from sb3_amago.buffers import MIN_ROWS_PER_ENV, TrajectoryReplayBuffer
from sb3_amago.exploration import ActionNoiseExploration, Exploration
from sb3_amago.keys import PREV_REWARD_KEY
from sb3_amago.wrappers import flat_dict_space

DEFAULT_N_CRITICS = 4
SUPPORTED_OBS_SPACES = (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def check_arguments(
    env: Any, batch_size: int, max_seq_len: int, n_critics: int, gamma: float, multigammas: tuple[float, ...], tau: float
) -> None:
    """The checks that can run before SB3's constructor (which would vectorise an env the replay cannot store)."""
    for name, value in (("batch_size", batch_size), ("max_seq_len", max_seq_len), ("n_critics", n_critics)):
        if int(value) < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if env is not None and not isinstance(env, str):
        check_observation_space(env.observation_space)
    check_discounts(gamma, multigammas)
    if not 0.0 <= float(tau) <= 1.0:
        raise ValueError(
            f"tau must lie in [0, 1] (the rate at which the target heads follow the online ones each update; "
            f"AMAGO's default is 0.003), got {tau}."
        )


def chosen_exploration(exploration: Exploration | None, action_noise: ActionNoise | None) -> Exploration | None:
    """The exploration asked for by AMAGO's ``exploration`` and ``action_noise`` arguments (None: the
    epsilon schedule of its other exploration arguments).

    :raises ValueError: if both are given
    """
    if action_noise is None:
        return exploration
    if exploration is not None:
        raise ValueError(
            "Give exploration or action_noise, not both: action_noise=noise is exploration=ActionNoiseExploration(noise)."
        )
    return ActionNoiseExploration(action_noise)


#: AMAGO's arguments that build its default epsilon schedule.
SCHEDULE_ARGUMENTS = ("epsilon_start", "epsilon_end", "exploration_steps", "rollout_exploration_horizon")


def warn_unused_schedule(exploration: Exploration, settings: Mapping[str, Any], signature: inspect.Signature) -> None:
    """Warn that the schedule arguments set away from their defaults change nothing when
    ``exploration`` (a user's object, or SB3 action noise) takes the schedule's place.

    :param settings: AMAGO's attributes, holding the values it got for :data:`SCHEDULE_ARGUMENTS`
    :param signature: AMAGO's constructor signature, holding their defaults
    """
    changed = [
        f"{name}={settings[name]!r}" for name in SCHEDULE_ARGUMENTS if settings[name] != signature.parameters[name].default
    ]
    if changed:
        warnings.warn(
            f"{', '.join(changed)} change nothing: the exploration given ({type(exploration).__name__}) takes the "
            "place of the epsilon schedule these arguments build. Set them on the exploration object, or drop "
            "exploration= / action_noise= to use them.",
            stacklevel=3,
        )


def critics_from_policy_kwargs(policy_kwargs: dict[str, Any] | None, n_critics: int) -> tuple[dict[str, Any] | None, int]:
    """``policy_kwargs`` without ``n_critics``, and the number of critics: the one in ``policy_kwargs``
    (where SAC / TQC users put it) if given, else AMAGO's ``n_critics`` argument.

    :raises ValueError: if both are given, differently (``n_critics`` other than its default 4)
    """
    if not policy_kwargs or "n_critics" not in policy_kwargs:
        return policy_kwargs, n_critics
    rest = {key: value for key, value in policy_kwargs.items() if key != "n_critics"}
    in_kwargs = policy_kwargs["n_critics"]
    if n_critics != DEFAULT_N_CRITICS and n_critics != in_kwargs:
        raise ValueError(
            f"n_critics={n_critics} and policy_kwargs n_critics={in_kwargs} disagree: give the number of critics once, "
            "either as AMAGO's n_critics argument or in policy_kwargs."
        )
    return rest, in_kwargs


def check_discounts(gamma: float, multigammas: tuple[float, ...]) -> None:
    """Raise a ValueError naming the argument unless every discount factor lies in [0, 1)."""
    for name, values in (("gamma", (gamma,)), ("multigammas", tuple(multigammas))):
        bad = [g for g in values if not 0.0 <= float(g) < 1.0]
        if bad:
            raise ValueError(
                f"{name} holds {bad}: every discount factor must lie in [0, 1) (a critic with gamma >= 1 has no "
                f"finite value). Use values such as 0.99 or 0.999."
            )


def warn_short_replay(buffer_size: int, max_seq_len: int, n_envs: int) -> None:
    """Warn if the replay holds less than one training window (``max_seq_len + 1`` steps) per env: it
    then trains on the shorter windows it holds, which limits the context the model learns from."""
    per_env = max(buffer_size // n_envs, MIN_ROWS_PER_ENV)
    if per_env < max_seq_len + 1:
        warnings.warn(
            f"buffer_size={buffer_size} holds {per_env} steps per env ({n_envs} envs), less than one training window "
            f"(max_seq_len + 1 = {max_seq_len + 1} steps): training uses the shorter windows the replay holds. Raise "
            f"buffer_size to at least {(max_seq_len + 1) * n_envs} to train on whole windows."
        )


def check_episode_train_freq(train_freq: int | tuple[int, str], n_envs: int) -> None:
    """Refuse ``train_freq`` in episodes with several envs, which SB3's collection cannot do (it
    asserts at the first ``learn``), at construction and with the fix."""
    frequency, unit = train_freq if isinstance(train_freq, tuple) and len(train_freq) == 2 else (train_freq, "step")
    if n_envs > 1 and str(getattr(unit, "value", unit)) == "episode":
        raise ValueError(
            f"train_freq={train_freq} counts episodes, which SB3 collects with one env only, but the env has "
            f"{n_envs}: use train_freq=({frequency}, 'step') (steps of every env) or a single env."
        )


def n_step_setting(n_steps: int, n_step: int) -> int:
    """The loss's ``n_step`` from SB3's ``n_steps`` (n-step returns, the same meaning) and AMAGO's own
    ``n_step``: whichever is not 1.

    :raises ValueError: if both are given, differently
    """
    if int(n_steps) != 1 and int(n_step) != 1 and int(n_steps) != int(n_step):
        raise ValueError(
            f"n_steps={n_steps} and n_step={n_step} disagree: both set the n-step TD targets; give the number of "
            "steps once (n_steps, SB3's name, or n_step)."
        )
    return int(n_steps) if int(n_steps) != 1 else int(n_step)


def check_sb3_arguments(
    replay_buffer_class: type | None, use_sde: bool, sde_sample_freq: int, use_sde_at_warmup: bool
) -> None:
    """Refuse, naming the alternative, the SB3 off-policy options that AMAGO cannot honour: a replay
    that is not a :class:`~sb3_amago.buffers.TrajectoryReplayBuffer`, and gSDE. (``sde_sample_freq``
    and ``use_sde_at_warmup`` are ignored without ``use_sde``, as in SB3.)"""
    if replay_buffer_class is not None:
        check_replay_buffer_class(replay_buffer_class)
    if use_sde:
        raise ValueError(
            f"use_sde=True (sde_sample_freq={sde_sample_freq}, use_sde_at_warmup={use_sde_at_warmup}): AMAGO has "
            "no gSDE. Drop use_sde: Box actions are explored by the default Gaussian schedule (epsilon_start, "
            "epsilon_end, exploration_steps), or by SB3's action noise as in TD3 (action_noise=NormalActionNoise(...) "
            "or OrnsteinUhlenbeckActionNoise(...))."
        )


def check_replay_buffer_class(replay_buffer_class: type) -> None:
    """Refuse a replay class AMAGO cannot sample windows of whole rollouts from, naming what to use."""
    if isinstance(replay_buffer_class, type) and issubclass(replay_buffer_class, TrajectoryReplayBuffer):
        return
    name = getattr(replay_buffer_class, "__name__", repr(replay_buffer_class))
    hint = (
        " For hindsight relabeling, which HerReplayBuffer does for SB3, give AMAGO relabeler=... (e.g. "
        "sb3_amago.relabel.GoalEnvRelabeler for goal-conditioned Dict envs)."
        if isinstance(replay_buffer_class, type) and issubclass(replay_buffer_class, HerReplayBuffer)
        else ""
    )
    raise ValueError(
        f"replay_buffer_class={name}: AMAGO trains on windows of whole rollouts, which only "
        "sb3_amago.buffers.TrajectoryReplayBuffer (the default, replay_buffer_class=None) or a subclass of it "
        f"can sample; SB3's replays hold single transitions.{hint}"
    )


def check_observation_space(space: spaces.Space) -> None:
    """Raise a clear error for observation spaces AMAGO cannot embed (Tuple and Dict spaces, nested
    or not, are checked part by part)."""
    for key, sub in flat_dict_space(space).spaces.items():
        if not isinstance(sub, SUPPORTED_OBS_SPACES):
            raise ValueError(
                f"Observation '{key}' has space {sub}, which AMAGO cannot embed. Supported: Box, Discrete, "
                "MultiDiscrete, MultiBinary, and Dict / Tuple spaces of these, nested or not. Wrap the env to turn "
                "this part into one of them (or drop it)."
            )


def warn_without_reward_input(observation_space: spaces.Space) -> None:
    """Warn that the policy will not see rewards in context unless the observations carry ``prev_reward``."""
    if not (isinstance(observation_space, spaces.Dict) and PREV_REWARD_KEY in observation_space.spaces):
        warnings.warn(
            "The observations carry no 'prev_reward' key, so the policy does not see rewards in context. "
            "Wrap the env with sb3_amago.PrevRewardWrapper for in-context RL (meta-RL, reward-dependent memory)."
        )
