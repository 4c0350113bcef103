"""Datasets of episodes in and out of the replay: Minari datasets (the Farama format for offline RL
data) or any iterable of episodes, turned into the replay's rollouts, and the replay's rollouts
written back as a Minari dataset.

An episode of ``T`` steps holds ``T + 1`` observations (the reset observation first, the final one
last) and ``T`` actions, rewards, terminations and truncations, ``rewards[t]`` received after
``actions[t]`` was taken at ``observations[t]``: Minari's layout, and exactly a stored rollout's
(:class:`~sb3_amago.relabel.Rollout`), so an episode becomes a rollout without shifting anything.
Where the model's observations carry ``prev_reward`` and the episode's do not, it is built from
the rewards: 0 at the reset observation, ``rewards[t - 1]`` at observation ``t``, as
:class:`~sb3_amago.wrappers.PrevRewardWrapper` gives it online. Tuple and nested Dict observations
are flattened as :class:`~sb3_amago.wrappers.FlatDictObservation` flattens them.

``minari`` is imported only here, inside the functions that need it (``pip install sb3-amago[data]``).
"""

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium import spaces

from sb3_amago.distributions import ActionType
from sb3_amago.keys import OBS_KEY, PREV_REWARD_KEY
from sb3_amago.relabel import Rollout
from sb3_amago.validation import check_finite
from sb3_amago.wrappers import flat_dict_obs, flat_dict_space

if TYPE_CHECKING:  # pragma: no cover
    from minari import MinariDataset

EPISODE_FIELDS = ("observations", "actions", "rewards", "terminations", "truncations")


def import_minari() -> Any:
    """The ``minari`` module, or an ImportError that names the extra to install."""
    try:
        import minari
    except ImportError as exc:
        raise ImportError(
            "Minari datasets need the minari package: pip install sb3-amago[data] (or pip install 'minari[hdf5]')."
        ) from exc
    return minari


def _is_minari_dataset(dataset: Any) -> bool:
    """True for a ``minari.MinariDataset`` (without importing minari when it is not loaded)."""
    return type(dataset).__name__ == "MinariDataset" and type(dataset).__module__.startswith("minari")


def _with_prev_reward(space: spaces.Space, model_space: spaces.Space) -> spaces.Space:
    """``space`` as the model's observations would hold it: flattened to a Dict where the model's
    space is one, and with the model's ``prev_reward`` where the model has it and ``space`` lacks it."""
    if not isinstance(model_space, spaces.Dict):
        return space
    flat = flat_dict_space(space)
    if PREV_REWARD_KEY in model_space.spaces and PREV_REWARD_KEY not in flat.spaces:
        flat.spaces[PREV_REWARD_KEY] = model_space.spaces[PREV_REWARD_KEY]
    return flat


def check_dataset_spaces(
    observation_space: spaces.Space, action_space: spaces.Space, model_obs: spaces.Space, model_action: spaces.Space
) -> None:
    """Raise a ValueError naming both spaces unless a dataset of ``observation_space`` and
    ``action_space`` fits the model's (observations up to flattening and the added ``prev_reward``)."""
    if _with_prev_reward(observation_space, model_obs) != model_obs:
        raise ValueError(
            f"The dataset's observation space {observation_space} does not match the model's {model_obs}"
            + (
                f" (the dataset's, as the model would store it: {_with_prev_reward(observation_space, model_obs)})"
                if isinstance(model_obs, spaces.Dict)
                else ""
            )
            + ": build the model for the env that recorded the dataset (wrapped as it was, PrevRewardWrapper aside)."
        )
    if action_space != model_action:
        raise ValueError(
            f"The dataset's action space {action_space} does not match the model's {model_action}: "
            "build the model for the env that recorded the dataset."
        )


def _field(episode: Any, name: str) -> Any:
    if isinstance(episode, Mapping):
        if name not in episode:
            raise ValueError(f"no '{name}' (an episode holds {', '.join(EPISODE_FIELDS)})")
        return episode[name]
    if not hasattr(episode, name):
        raise ValueError(f"a {type(episode).__name__} without '{name}' (an episode holds {', '.join(EPISODE_FIELDS)})")
    return getattr(episode, name)


def _n_rows(value: Any) -> int:
    """The number of rows of an array, or the common number of a dict / tuple of arrays (-1 if they differ)."""
    if isinstance(value, Mapping):
        counts = {_n_rows(part) for part in value.values()}
    elif isinstance(value, tuple):
        counts = {_n_rows(part) for part in value}
    else:
        return len(np.asarray(value))
    return counts.pop() if len(counts) == 1 else -1


def episode_rollout(episode: Any, model_obs: spaces.Space, action_type: ActionType, obs_space: spaces.Space | None) -> Rollout:
    """One episode (Minari's ``EpisodeData``, or a mapping of :data:`EPISODE_FIELDS`) as a rollout of
    the model's observations and buffer actions, unvalidated but for what the conversion needs.

    :param obs_space: the episode's observation space if known (a Minari dataset's), else its
        observations are read by their structure (dicts as Dict parts, tuples as Tuple parts)
    :raises ValueError: on missing fields, arrays of different lengths, an end before the last step,
        NaN in the end flags, actions outside a Box
    """
    values = {name: _field(episode, name) for name in EPISODE_FIELDS}
    rewards = np.asarray(values["rewards"])
    n = len(rewards)
    counts = {name: _n_rows(value) for name, value in values.items()}
    if counts["observations"] != n + 1 or any(counts[name] != n for name in EPISODE_FIELDS[1:]):
        listed = ", ".join(f"{counts[name]} {name}" for name in EPISODE_FIELDS)
        raise ValueError(
            f"arrays of different lengths: {listed} (an episode of T steps holds T + 1 observations, the "
            "final one included, and T of each other; -1: the parts of a Dict / Tuple differ)"
        )
    ends = {}
    for name in ("terminations", "truncations"):
        flags = np.asarray(values[name])
        check_finite(name, flags, fix="end flags are True / False.")
        ends[name] = flags.astype(bool).reshape(n)
    ended = ends["terminations"] | ends["truncations"]
    if n and ended[:-1].any():
        raise ValueError(
            f"it ends at step {int(np.argmax(ended))}, before its last step {n - 1}: split it into one episode per end"
        )
    if isinstance(model_obs, spaces.Dict):
        observations = {key: np.asarray(value) for key, value in flat_dict_obs(values["observations"], obs_space).items()}
        if PREV_REWARD_KEY in model_obs.spaces and PREV_REWARD_KEY not in observations:
            prev_reward = np.zeros((n + 1, 1), dtype=np.float32)
            prev_reward[1:, 0] = rewards
            observations[PREV_REWARD_KEY] = prev_reward
        missing = sorted(set(model_obs.spaces) - set(observations))
        extra = sorted(set(observations) - set(model_obs.spaces))
        if missing or extra:
            raise ValueError(
                f"observation keys {sorted(observations)}, but the model's are {sorted(model_obs.spaces)}"
                + (f" (missing {missing})" if missing else "")
                + (f" (not the model's: {extra})" if extra else "")
            )
    else:
        observations = {OBS_KEY: np.asarray(values["observations"])}
    actions = np.asarray(values["actions"])
    space = action_type.space
    if isinstance(space, spaces.Box):
        check_finite("actions", actions, fix="the replay stores finite actions only.")
        if actions.size and (np.any(actions < space.low) or np.any(actions > space.high)):
            raise ValueError(f"actions outside the action space {space}")
    terminated = bool(n and ends["terminations"][-1])
    truncated = bool(n and ends["truncations"][-1]) and not terminated  # as SB3: a termination takes precedence
    return Rollout(
        observations=observations,
        actions=action_type.to_buffer(actions) if n else actions.reshape(0, action_type.action_dim),
        rewards=rewards,
        terminated=terminated,
        truncated=truncated,
    )


def dataset_rollouts(
    dataset: "MinariDataset | Iterable[Any]", model_obs: spaces.Space, action_type: ActionType, capacity: int | None = None
) -> tuple[list[Rollout], list[str]]:
    """The episodes of ``dataset`` as rollouts for a model of observation space ``model_obs`` and the
    action space of ``action_type``, and a name for each (for error messages).

    :param dataset: a ``minari.MinariDataset`` (its spaces are checked against the model's) or an
        iterable of episodes (Minari's ``EpisodeData``, or mappings of :data:`EPISODE_FIELDS`)
    :param capacity: rows the replay holds; a Minari dataset with more (its steps plus one final
        observation per episode) is refused before its episodes are read
    :raises ValueError: naming the episode and the problem
    """
    obs_space = None
    if _is_minari_dataset(dataset):
        minari_dataset: Any = dataset
        check_dataset_spaces(minari_dataset.observation_space, minari_dataset.action_space, model_obs, action_type.space)
        rows = int(minari_dataset.total_steps) + int(minari_dataset.total_episodes)
        if capacity is not None and rows > capacity:
            raise ValueError(
                f"The dataset's {minari_dataset.total_episodes} episodes take {rows} rows (one per observation, the final one "
                f"included), more than the replay holds (buffer_size={capacity}): raise buffer_size or use part of "
                "the dataset (minari's split_dataset, or a list of its episodes). Nothing was stored."
            )
        obs_space = minari_dataset.observation_space
        episodes: Iterable[Any] = minari_dataset.iterate_episodes()
    elif isinstance(dataset, (Mapping, str, bytes)) or not isinstance(dataset, Iterable):
        raise ValueError(
            f"add_dataset takes a minari.MinariDataset or an iterable of episodes, got a {type(dataset).__name__} "
            "(for one episode, pass a list holding it)."
        )
    else:
        episodes = dataset
    rollouts, names = [], []
    for i, episode in enumerate(episodes):
        episode_id = _episode_id(episode, i)
        name = f"episode {episode_id}" if episode_id == i else f"episode {i} (id {episode_id})"
        try:
            rollouts.append(episode_rollout(episode, model_obs, action_type, obs_space))
        except ValueError as exc:
            raise ValueError(f"{name}: {str(exc).rstrip('.')}. Nothing was stored.") from None
        names.append(name)
    return rollouts, names


def _episode_id(episode: Any, index: int) -> int:
    value = episode.get("id", index) if isinstance(episode, Mapping) else getattr(episode, "id", index)
    return index if value is None else int(value)


def write_minari_dataset(
    dataset_id: str,
    rollouts: list[Rollout],
    observation_space: spaces.Space,
    action_type: ActionType,
    **minari_kwargs: Any,
) -> "MinariDataset":
    """Write ``rollouts`` (finished ones, as the replay stores them) as the Minari dataset
    ``dataset_id`` under Minari's local datasets folder (``MINARI_DATASETS_PATH``), actions in the
    env's format, observations in the replay's (flat) space, images unencoded (``jpeg_encoding=False``,
    so they read back exactly). ``minari_kwargs`` go to ``minari.create_dataset_from_buffers``
    (``author``, ``description``, ``env``, ...)."""
    minari = import_minari()
    from minari.data_collector import EpisodeBuffer

    def minari_obs(rollout: Rollout) -> Any:
        if not isinstance(observation_space, spaces.Dict):
            return _minari_part(rollout.observations[OBS_KEY], observation_space)
        return {key: _minari_part(rollout.observations[key], space) for key, space in observation_space.spaces.items()}

    buffers = [
        EpisodeBuffer(
            id=i,
            observations=minari_obs(rollout),
            actions=action_type.to_env(np.asarray(rollout.actions)),
            rewards=np.asarray(rollout.rewards, dtype=np.float32),
            terminations=np.arange(rollout.length) == rollout.length - 1
            if rollout.terminated
            else np.zeros(rollout.length, bool),
            truncations=np.arange(rollout.length) == rollout.length - 1
            if rollout.truncated
            else np.zeros(rollout.length, bool),
            infos={},
        )
        for i, rollout in enumerate(rollouts)
    ]
    kwargs = {
        "jpeg_encoding": False,
        "algorithm_name": "sb3-amago AMAGO",
        "observation_space": observation_space,
        "action_space": action_type.space,
        **minari_kwargs,
    }
    return minari.create_dataset_from_buffers(dataset_id, buffers, **kwargs)


def _minari_part(value: np.ndarray, space: spaces.Space) -> np.ndarray:
    """A stored observation part ``(T + 1, *stored_shape)`` in the shape its space gives it (Discrete: ``(T + 1,)``)."""
    return value.reshape(len(value)) if isinstance(space, spaces.Discrete) else value
