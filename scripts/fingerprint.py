"""A fingerprint of training: one hash line per case, to compare before and after a refactor that
must leave training bit for bit unchanged.

    python scripts/fingerprint.py                  # train every case, print its hashes
    python scripts/fingerprint.py --save DIR       # also save each case's model, replay and envs half-way
    python scripts/fingerprint.py --resume DIR     # load those files instead, train the second half, print

A case trains a tiny seeded AMAGO for two ``learn`` calls (random actions, then updates with
exploration), on CPU with one torch thread. Its line holds a hash of:

* ``state``: every parameter and buffer of the policy, every optimizer moment and setting,
  ``num_timesteps``, the update count and the global RNG states (torch, numpy, python, the action
  space's), after the second ``learn`` and again after a short third one (which runs on the
  collection context and the exploration state the second one left);
* ``replay``: the replay's storage arrays, sizes and three sampled batches;
* ``predict``: deterministic and sampled actions of ``predict`` on fresh evaluation envs;
* ``train_log``: what one more ``train`` call logs;
* ``learn_log``: everything the ``learn`` calls logged (``time/`` keys excepted); ``-`` for
  ``--resume``, whose first half ran elsewhere.

``--resume DIR`` with files that an earlier version of the package saved (``--save DIR``) checks
that the current code loads them and resumes exactly: its lines must equal the plain run's, but
for ``learn_log``.
"""

import argparse
import copy
import hashlib
import pickle
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import KVWriter, Logger
from stable_baselines3.common.vec_env import VecEnv

import sb3_amago  # noqa: F401  (registers the amago-* env ids)
from sb3_amago import AMAGO, PrevRewardWrapper
from sb3_amago.relabel import HindsightInstructionRelabeler

TINY = {
    "traj_encoder_kwargs": {"d_model": 16, "n_heads": 2, "d_ff": 32, "n_layers": 1},
    "d_embed": 16,
    "actor_hidden": (16,),
    "critic_hidden": (16,),
    "timestep_encoder_kwargs": {"hidden_sizes": (16,)},
}
COMMON = {
    "max_seq_len": 8,
    "learning_starts": 40,
    "batch_size": 4,
    "train_freq": 4,
    "warmup_steps": 50,
    "exploration_steps": 200,
    "seed": 0,
    "device": "cpu",
}
FIRST_STEPS, SECOND_STEPS, THIRD_STEPS = 64, 64, 16


class StepEnv(gym.Env):
    """Observation = [step number]; reward on arriving at step t+1 = t / 10 + sum(action); ends after
    a length drawn from 2..8 at each reset."""

    def __init__(self, action_space: spaces.Space) -> None:
        self.observation_space = spaces.Box(0, 100, shape=(1,), dtype=np.float32)
        self.action_space = action_space
        self.t = self.length = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t, self.length = 0, int(self.np_random.integers(2, 9))
        return np.array([0.0], dtype=np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = self.t / 10.0 + float(np.sum(action))
        self.t += 1
        return np.array([float(self.t)], dtype=np.float32), reward, self.t >= self.length, False, {}


def step_envs(action_space: spaces.Space, prev_reward: bool) -> Callable[[int], VecEnv]:
    def make(seed: int) -> VecEnv:
        def one() -> gym.Env:
            env = StepEnv(copy.deepcopy(action_space))  # its own space: seeding one env's leaves the others'
            return PrevRewardWrapper(env) if prev_reward else env

        return make_vec_env(one, n_envs=2, seed=seed)

    return make


def maze_envs(seed: int) -> VecEnv:
    return make_vec_env("amago-MazeRunner7-v0", n_envs=2, seed=seed)


@dataclass
class Case:
    """One fingerprinted run: its envs (``make_envs(seed)``) and AMAGO's arguments beyond :data:`COMMON`."""

    make_envs: Callable[[int], VecEnv]
    kwargs: dict[str, Any] = field(default_factory=dict)


CASES: dict[str, Case] = {
    # Discrete actions, a plain Box observation.
    "discrete": Case(step_envs(spaces.Discrete(3), prev_reward=False)),
    # MultiDiscrete actions, Dict observation with prev_reward, GRU, the bi-level exploration schedule.
    "multidiscrete": Case(
        step_envs(spaces.MultiDiscrete([2, 3]), prev_reward=True),
        {
            "rollout_exploration_horizon": 5,
            "policy_kwargs": {**TINY, "traj_encoder": "gru", "traj_encoder_kwargs": {"d_hidden": 16}},
        },
    ),
    # Box actions, Dict observation with prev_reward.
    "box": Case(step_envs(spaces.Box(-2.0, 2.0, shape=(2,), dtype=np.float32), prev_reward=True)),
    # Discrete actions on an instruction env: Dict observation with prev_reward, a hidden key, relabeling.
    "relabel": Case(maze_envs, {"relabeler": HindsightInstructionRelabeler("some"), "reward_multiplier": 100.0}),
}


class Collector(KVWriter):
    """Keeps every dumped key-value pair but the ``time/`` ones."""

    def __init__(self) -> None:
        self.records: list[tuple[int, str, Any]] = []

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0) -> None:
        self.records += [(step, key, value) for key, value in sorted(key_values.items()) if not key.startswith("time/")]


def collecting_logger() -> tuple[Logger, Collector]:
    collector = Collector()
    return Logger(folder=None, output_formats=[collector]), collector


class Hasher:
    """A sha256 of named values (tensors, arrays, plain values), in the order given."""

    def __init__(self) -> None:
        self.digest = hashlib.sha256()

    def add(self, name: str, value: Any) -> None:
        self.digest.update(name.encode())
        if isinstance(value, th.Tensor):
            value = value.detach().cpu().numpy()
        if isinstance(value, np.ndarray):
            self.digest.update(f"{value.dtype}{value.shape}".encode())
            self.digest.update(np.ascontiguousarray(value).tobytes())
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                self.add(f"{name}.{key}", value[key])
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                self.add(f"{name}[{i}]", item)
        else:
            self.digest.update(repr(value).encode())

    def hex(self) -> str:
        return self.digest.hexdigest()[:16]


def add_state(hasher: Hasher, model: AMAGO, tag: str) -> None:
    hasher.add(f"{tag}.steps", (model.num_timesteps, model._n_updates))
    hasher.add(f"{tag}.policy", dict(model.policy.state_dict()))
    optimizer = model.policy.optimizer.state_dict()
    hasher.add(f"{tag}.optimizer", optimizer["state"])
    hasher.add(f"{tag}.param_groups", [{k: v for k, v in g.items() if k != "params"} for g in optimizer["param_groups"]])
    hasher.add(f"{tag}.rng.torch", th.get_rng_state())
    hasher.add(f"{tag}.rng.numpy", list(np.random.get_state()))
    hasher.add(f"{tag}.rng.python", random.getstate())
    hasher.add(f"{tag}.rng.action_space", model.action_space.np_random.bit_generator.state)


def replay_hash(model: AMAGO) -> str:
    hasher = Hasher()
    replay = model.replay_buffer
    for name in ("observations", "actions", "rewards", "dones", "timeouts", "time_steps", "pos", "full"):
        hasher.add(name, getattr(replay, name))
    hasher.add("sizes", (replay.size(), replay.num_rollouts()))
    saved = np.random.get_state()
    np.random.seed(123)
    for i in range(3):
        batch = replay.sample(4)
        hasher.add(f"batch{i}", {name: getattr(batch, name) for name in batch._fields})
    np.random.set_state(saved)
    return hasher.hex()


def predict_hash(model: AMAGO, case: Case) -> str:
    hasher = Hasher()
    env = case.make_envs(99)
    for deterministic in (True, False):
        th.manual_seed(5)
        obs, state, starts = env.reset(), None, np.ones(env.num_envs, dtype=bool)
        for step in range(6):
            action, state = model.predict(obs, state=state, episode_start=starts, deterministic=deterministic)
            hasher.add(f"{deterministic}.{step}", action)
            obs, _, starts, _ = env.step(action)
    env.close()
    return hasher.hex()


def finish(model: AMAGO, case: Case) -> dict[str, str]:
    """The hashes after the second ``learn`` (the third ``learn`` and ``train`` included)."""
    state = Hasher()
    add_state(state, model, "second")
    replay = replay_hash(model)
    predict = predict_hash(model, case)
    model.learn(THIRD_STEPS, reset_num_timesteps=False)
    add_state(state, model, "third")
    logger, collector = collecting_logger()
    model.set_logger(logger)
    model.train(gradient_steps=2, batch_size=4)
    logger.dump(model.num_timesteps)
    train_log = Hasher()
    train_log.add("records", collector.records)
    return {"state": state.hex(), "replay": replay, "predict": predict, "train_log": train_log.hex()}


def build(case: Case) -> tuple[AMAGO, VecEnv]:
    env = case.make_envs(0)
    kwargs = {**COMMON, "policy_kwargs": TINY, **case.kwargs}
    return AMAGO("TransformerPolicy", env, **kwargs), env


def run_case(name: str, case: Case, save_dir: Path | None) -> dict[str, str]:
    model, env = build(case)
    logger, collector = collecting_logger()
    model.set_logger(logger)
    model.learn(FIRST_STEPS)
    if save_dir is not None:
        model.save(save_dir / f"{name}.zip")
        model.save_replay_buffer(save_dir / f"{name}_replay.pkl")
        (save_dir / f"{name}_env.pkl").write_bytes(pickle.dumps(copy.deepcopy(env)))
    model.learn(SECOND_STEPS, reset_num_timesteps=False)
    learn_log = Hasher()
    learn_log.add("records", collector.records)
    return {**finish(model, case), "learn_log": learn_log.hex()}


def resume_case(name: str, case: Case, save_dir: Path) -> dict[str, str]:
    env = pickle.loads((save_dir / f"{name}_env.pkl").read_bytes())
    model = AMAGO.load(save_dir / f"{name}.zip", env=env, force_reset=False)
    model.load_replay_buffer(save_dir / f"{name}_replay.pkl")
    logger, _ = collecting_logger()
    model.set_logger(logger)
    model.learn(SECOND_STEPS, reset_num_timesteps=False)
    return {**finish(model, case), "learn_log": "-"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--save", type=Path, metavar="DIR", help="save each case's files half-way into DIR")
    group.add_argument("--resume", type=Path, metavar="DIR", help="resume each case from the files in DIR")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    args = parser.parse_args(argv)
    th.set_num_threads(1)
    if args.save is not None:
        args.save.mkdir(parents=True, exist_ok=True)
    for name in args.cases:
        case = CASES[name]
        hashes = resume_case(name, case, args.resume) if args.resume else run_case(name, case, args.save)
        print(f"{name:<14}" + "  ".join(f"{key}={value}" for key, value in hashes.items()), flush=True)


if __name__ == "__main__":
    sys.exit(main())
