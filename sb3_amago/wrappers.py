"""Context wrappers: put what AMAGO's policy conditions on into the observation.

AMAGO's timestep encoder sees, besides the observation, the reward received on arriving at the
step (and, in meta-RL, a flag marking the start of a new trial). These come through the
observation so that training, ``predict``, ``evaluate_policy`` and RL Zoo's enjoy all see the same
inputs. The previous action is tracked by the model itself and needs no wrapper.

``PrevRewardWrapper(env)`` turns any env's observation into a Dict::

    Box / Discrete / ... obs  ->  {"observation": obs, "prev_reward": (1,) float32}
    Dict obs                  ->  the same dict plus "prev_reward"
    Tuple obs                 ->  {"observation_0": ..., "observation_1": ..., "prev_reward": ...}
    nested Dict / Tuple obs   ->  flattened first (see flat_dict_space: "outer/inner", "observation_0/key")

``TrialsWrapper(env, n_trials=k)`` (meta-RL) runs ``k`` episodes of one task in one rollout and adds
``"trial_reset"`` as well; see its docstring and the :class:`TaskEnv` protocol.
"""

from collections.abc import Iterator, Mapping
from typing import Any, Protocol, SupportsFloat

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper

from sb3_amago.keys import OBS_KEY, PREV_REWARD_KEY, TRIAL_RESET_KEY


def is_structured(space: spaces.Space) -> bool:
    """True for spaces SB3 cannot store as they are: a Tuple, or a Dict holding a Dict or Tuple."""
    if isinstance(space, spaces.Tuple):
        return True
    return isinstance(space, spaces.Dict) and any(isinstance(s, (spaces.Dict, spaces.Tuple)) for s in space.spaces.values())


def _flat_items(space: spaces.Space, prefix: str | None) -> Iterator[tuple[str, spaces.Space]]:
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            yield from _flat_items(sub, key if prefix is None else f"{prefix}/{key}")
    elif isinstance(space, spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            yield from _flat_items(sub, f"{prefix or OBS_KEY}_{i}")
    else:
        yield prefix or OBS_KEY, space


def flat_dict_space(space: spaces.Space) -> spaces.Dict:
    """Any observation space as a Dict with neither Dict nor Tuple inside (what SB3 stores).

    Names: the parts of a Tuple are ``<name>_<i>`` (``observation_<i>`` at the top level), the keys
    of a Dict ``<name>/<key>`` (the key itself at the top level), and a space that is neither
    ``<name>`` (``observation`` at the top level). So ``Tuple(Box, Dict(a=Discrete))`` becomes
    ``Dict(observation_0=Box, observation_1/a=Discrete)`` and a Box becomes ``Dict(observation=Box)``.
    (No dots: the names key torch module dicts.)

    :raises ValueError: if two parts get the same name (a Dict key containing "/" can collide)
    """
    flat: dict[str, spaces.Space] = {}
    for name, leaf in _flat_items(space, None):
        if name in flat:
            raise ValueError(f"Two parts of the observation space {space} flatten to the name '{name}': rename a Dict key.")
        flat[name] = leaf
    return spaces.Dict(flat)


def flat_dict_obs(obs: Any, space: spaces.Space | None = None, prefix: str | None = None) -> dict[str, Any]:
    """The observation counterpart of :func:`flat_dict_space`, one observation or a VecEnv batch.

    :param obs: an observation of ``space``
    :param space: its space; without it the observation's own structure is followed (tuples as
        Tuple parts, mappings as Dict keys, anything else as a leaf)
    :param prefix: the name of ``obs`` inside a larger observation (None at the top level)
    """
    if isinstance(space, spaces.Dict) or (space is None and isinstance(obs, Mapping)):
        keys = space.spaces if isinstance(space, spaces.Dict) else obs
        out: dict[str, Any] = {}
        for key in keys:
            sub = space.spaces[key] if isinstance(space, spaces.Dict) else None
            out.update(flat_dict_obs(obs[key], sub, key if prefix is None else f"{prefix}/{key}"))
        return out
    if isinstance(space, spaces.Tuple) or (space is None and isinstance(obs, tuple)):
        subs = space.spaces if isinstance(space, spaces.Tuple) else [None] * len(obs)
        out = {}
        for i, (part, sub) in enumerate(zip(obs, subs, strict=True)):
            out.update(flat_dict_obs(part, sub, f"{prefix or OBS_KEY}_{i}"))
        return out
    return {prefix or OBS_KEY: obs}


class FlatDictObservation(gym.ObservationWrapper):
    """Tuple and nested Dict observations as one flat Dict (see :func:`flat_dict_space`).

    :class:`sb3_amago.AMAGO` applies it to such envs itself; ``predict`` flattens raw observations
    of the inner env the same way.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._inner_space = env.observation_space
        self.observation_space = flat_dict_space(env.observation_space)

    def observation(self, observation: Any) -> dict[str, Any]:
        return flat_dict_obs(observation, self._inner_space)


class VecFlatDictObservation(VecEnvWrapper):
    """:class:`FlatDictObservation` for a VecEnv whose observations are tuples (or nested dicts),
    terminal observations in ``infos`` included."""

    def __init__(self, venv: VecEnv) -> None:
        super().__init__(venv, observation_space=flat_dict_space(venv.observation_space))
        self._inner_space = venv.observation_space

    def reset(self) -> dict[str, np.ndarray]:
        return flat_dict_obs(self.venv.reset(), self._inner_space)

    def step_wait(self) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, list[dict[str, Any]]]:
        obs, rewards, dones, infos = self.venv.step_wait()
        for info in infos:
            if "terminal_observation" in info:
                info["terminal_observation"] = flat_dict_obs(info["terminal_observation"], self._inner_space)
        return flat_dict_obs(obs, self._inner_space), rewards, dones, infos


class PrevRewardWrapper(gym.Wrapper):
    """Add the reward received on arriving at each step to the observation, key ``"prev_reward"``.

    The first observation of an episode carries reward 0.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        if isinstance(env.observation_space, spaces.Dict) and PREV_REWARD_KEY in env.observation_space.spaces:
            raise ValueError(f"The observation already has a '{PREV_REWARD_KEY}' key: wrap the env only once.")
        inner = env.observation_space
        self._inner_space = inner
        dict_space = flat_dict_space(inner)
        dict_space.spaces[PREV_REWARD_KEY] = spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float32)
        self.observation_space = dict_space

    def _wrap(self, obs: Any, reward: float) -> dict[str, Any]:
        out = flat_dict_obs(obs, self._inner_space)
        out[PREV_REWARD_KEY] = np.array([reward], dtype=np.float32)
        return out

    def reset(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return self._wrap(obs, 0.0), info

    def step(self, action: Any) -> tuple[dict[str, Any], SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._wrap(obs, float(reward)), reward, terminated, truncated, info


# Independent task stream: the task RNG and the env's own RNG never share a seed sequence.
_TASK_SEED_SALT = 0x7A5C


class TaskEnv(Protocol):
    """An env with a task distribution, as :class:`TrialsWrapper` needs it.

    ``sample_task(np_random)`` draws a task with the given generator and returns it (any value);
    ``set_task(task)`` makes every following ``reset()`` and ``step()`` use that task until the next
    ``set_task``. The methods may live on the env or any wrapper inside the one passed in.
    """

    def sample_task(self, np_random: np.random.Generator) -> Any:
        """Draw a task."""

    def set_task(self, task: Any) -> None:
        """Use ``task`` from the next reset on."""


class TrialsWrapper(gym.Wrapper):
    """Meta-RL rollouts: several episodes ("trials") of one task in one rollout.

    ``reset()`` draws a task (``sample_task``, with the wrapper's own generator seeded by
    ``reset(seed=...)``), sets it, and resets the env. When the env's episode ends (terminated or
    truncated) inside the rollout, the wrapper resets the env with the same task (a *soft reset*)
    and the rollout runs on, so a memory policy can carry what it learnt into the next trial. The
    rollout ends when ``n_trials`` trials have ended or after ``max_rollout_steps`` steps, whichever
    comes first; it is *terminated* if the step that ends it terminated the env's episode, else
    *truncated*.

    Observation: a Dict with the env's observation (as in :class:`PrevRewardWrapper`: Box ->
    ``"observation"``, Dict keys kept, Tuple -> ``"observation_i"``), ``"prev_reward"`` (the reward
    received on arriving at the step, carried across soft resets; 0 on the rollout's first step) and
    ``"trial_reset"`` (``(1,)`` float32: 1.0 on the first step of each trial after the first, else 0).

    Info: ``"trial"`` (index of the trial the returned observation belongs to) on every step,
    ``"trial_return"`` on the step ending a trial (the env's info for that step is kept; the soft
    reset's info is dropped), and on the rollout's last step ``"trial_returns"``: the return of every
    trial begun, the last one partial if ``max_rollout_steps`` cut it.

    :param env: an env following the :class:`TaskEnv` protocol; it must end its own episodes
    :param n_trials: number of trials per rollout (>= 1), or None for no trial limit
    :param max_rollout_steps: steps per rollout (>= 1), or None for no step limit; at least one of
        the two limits must be given
    """

    def __init__(self, env: gym.Env, n_trials: int | None = None, max_rollout_steps: int | None = None) -> None:
        super().__init__(env)
        for name, value in (("n_trials", n_trials), ("max_rollout_steps", max_rollout_steps)):
            if value is not None and (not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}.")
        if n_trials is None and max_rollout_steps is None:
            raise ValueError("Give n_trials or max_rollout_steps (or both): a rollout needs an end.")
        try:
            self._sample_task = env.get_wrapper_attr("sample_task")
            self._set_task = env.get_wrapper_attr("set_task")
        except AttributeError as err:
            raise TypeError(
                f"{env} has no task distribution: TrialsWrapper needs sample_task(np_random) and set_task(task)."
            ) from err
        self.n_trials = n_trials
        self.max_rollout_steps = max_rollout_steps
        inner = env.observation_space
        self._inner_space = inner
        dict_space = flat_dict_space(inner)
        for key in (PREV_REWARD_KEY, TRIAL_RESET_KEY):
            if key in dict_space.spaces:
                raise ValueError(f"The observation already has a '{key}' key: it cannot also carry the trial context.")
        dict_space.spaces[PREV_REWARD_KEY] = spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float32)
        dict_space.spaces[TRIAL_RESET_KEY] = spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)
        self.observation_space = dict_space
        self._task_rng: np.random.Generator | None = None
        self.task: Any = None
        self._steps = 0
        self._trial_return = 0.0
        self._trial_returns: list[float] = []

    def _wrap(self, obs: Any, reward: float, trial_reset: bool) -> dict[str, Any]:
        out = flat_dict_obs(obs, self._inner_space)
        out[PREV_REWARD_KEY] = np.array([reward], dtype=np.float32)
        out[TRIAL_RESET_KEY] = np.array([float(trial_reset)], dtype=np.float32)
        return out

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Draw a new task and start its first trial."""
        if seed is not None or self._task_rng is None:
            self._task_rng = np.random.default_rng(None if seed is None else [seed, _TASK_SEED_SALT])
        self.task = self._sample_task(self._task_rng)
        self._set_task(self.task)
        obs, info = self.env.reset(seed=seed, options=options)
        self._steps = 0
        self._trial_return = 0.0
        self._trial_returns = []
        return self._wrap(obs, 0.0, trial_reset=False), {**info, "trial": 0}

    def step(self, action: Any) -> tuple[dict[str, Any], SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the current trial; soft-reset the env when the trial ends inside the rollout."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = {**info, "trial": len(self._trial_returns)}
        self._steps += 1
        self._trial_return += float(reward)
        trial_ended = terminated or truncated
        if trial_ended:
            info["trial_return"] = self._trial_return
        rollout_over = (self.max_rollout_steps is not None and self._steps >= self.max_rollout_steps) or (
            trial_ended and self.n_trials is not None and len(self._trial_returns) + 1 >= self.n_trials
        )
        if trial_ended or rollout_over:
            self._trial_returns.append(self._trial_return)
            self._trial_return = 0.0
        if rollout_over:
            info["trial_returns"] = list(self._trial_returns)
            rollout_terminated = bool(terminated)
            return self._wrap(obs, float(reward), False), reward, rollout_terminated, not rollout_terminated, info
        if trial_ended:
            obs, _ = self.env.reset()
            info["trial"] = len(self._trial_returns)
            return self._wrap(obs, float(reward), True), reward, False, False, info
        return self._wrap(obs, float(reward), False), reward, False, False, info
