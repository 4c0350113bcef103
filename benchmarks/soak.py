"""Soak: does a long run keep flat memory, and does the replay hold what ``buffer_size`` promises?

1. Replay bytes per transition, for each kind of observation and action space: the storage the
   replay allocates (``TrajectoryReplayBuffer.nbytes()``) divided by ``buffer_size``, beside the
   payload of one transition (observation, action, reward, done and timeout flags, time index).
2. A long run: AMAGO with a small Transformer collects and trains on POPGym RepeatPreviousEasy
   (8 envs) for 200,000 env steps with a 50,000-transition replay, full after a quarter of the run.
   The process's resident memory (RSS, from ``/proc/self/status``) is sampled every 5,000 env
   steps into ``soak_rss.csv``. Flat means: RSS grows by less than 5 % over the last half of the run.

    python benchmarks/soak.py                  # ~15 minutes on one core of a 2-core EPYC
    python benchmarks/soak.py --steps 20000    # a short check (the figures then say so)

Writes ``<out>/soak.json`` / ``soak.md`` (figures, command, torch version, threads, CPU, date) and
``<out>/soak_rss.csv``.
"""

import argparse
import csv
from pathlib import Path

import numpy as np
import torch as th
from common import RESULTS_DIR, write_results
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

from sb3_amago import AMAGO
from sb3_amago.buffers import TrajectoryReplayBuffer

ENV_ID = "amago-popgym-RepeatPreviousEasy-v0"
N_ENVS = 8
BUFFER_SIZE = 50_000
SAMPLE_EVERY = 5_000
#: Allowed RSS growth over the last half of the run.
FLAT = 0.05
SMALL_MODEL = {"d_embed": 32, "traj_encoder_kwargs": {"d_model": 64, "n_heads": 4, "d_ff": 128, "n_layers": 2}}
#: Observation and action spaces whose replay cost is reported.
SPACES: dict[str, tuple[spaces.Space, spaces.Space]] = {
    "Box(8) obs, Discrete(4) actions": (spaces.Box(-1, 1, (8,), np.float32), spaces.Discrete(4)),
    "Box(8) obs, MultiDiscrete([3, 3]) actions": (spaces.Box(-1, 1, (8,), np.float32), spaces.MultiDiscrete([3, 3])),
    "Box(8) obs, Box(2) actions": (spaces.Box(-1, 1, (8,), np.float32), spaces.Box(-1, 1, (2,), np.float32)),
    "64x64x3 uint8 image, Discrete(4) actions": (spaces.Box(0, 255, (64, 64, 3), np.uint8), spaces.Discrete(4)),
    "Dict(Box(8), prev_reward) obs, Discrete(4) actions": (
        spaces.Dict({"observation": spaces.Box(-1, 1, (8,), np.float32), "prev_reward": spaces.Box(-9, 9, (1,), np.float32)}),
        spaces.Discrete(4),
    ),
}


def payload_bytes(observation_space: spaces.Space, buffer: TrajectoryReplayBuffer) -> int:
    """Bytes of one stored transition's content: its observation, the action in the buffer's
    representation, a float32 reward, two bool flags and an int32 time index."""
    parts = observation_space.spaces.values() if isinstance(observation_space, spaces.Dict) else [observation_space]
    obs = sum(int(np.prod(space.shape)) * np.dtype(space.dtype).itemsize for space in parts)
    action = buffer.actions.shape[-1] * buffer.actions.itemsize
    return obs + action + 4 + 1 + 1 + 4


def replay_costs(buffer_size: int = 10_000) -> dict[str, dict[str, float]]:
    """Per space pair: allocated bytes per transition and the payload it holds."""
    costs = {}
    for name, (observation_space, action_space) in SPACES.items():
        buffer = TrajectoryReplayBuffer(buffer_size, observation_space, action_space, device="cpu", n_envs=1, max_seq_len=8)
        obs = observation_space.sample()
        batch = {k: v[None] for k, v in obs.items()} if isinstance(obs, dict) else obs[None]
        action = np.asarray(action_space.sample(), dtype=np.float32).reshape(1, -1)
        buffer.add(batch, batch, action, np.zeros(1, np.float32), np.zeros(1, bool), [{}])
        costs[name] = {"allocated": buffer.nbytes() / buffer_size, "payload": float(payload_bytes(observation_space, buffer))}
    return costs


def rss_bytes() -> int:
    """This process's resident set size."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmRSS line: the soak benchmark needs Linux.")


class RssSampler(BaseCallback):
    """Appends ``(env steps, RSS bytes, replay bytes)`` every ``every`` env steps."""

    def __init__(self, every: int) -> None:
        super().__init__()
        self.every = every
        self.next_sample = 0
        self.rows: list[tuple[int, int, int]] = []

    def _on_step(self) -> bool:
        if self.num_timesteps >= self.next_sample:
            self.rows.append((self.num_timesteps, rss_bytes(), self.model.replay_buffer.nbytes()))
            self.next_sample += self.every
        return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200_000, help="env steps of the long run")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    th.set_num_threads(args.threads)

    costs = replay_costs()
    env = make_vec_env(ENV_ID, n_envs=N_ENVS, seed=0)
    model = AMAGO(
        "TransformerPolicy", env, buffer_size=BUFFER_SIZE, max_seq_len=51, batch_size=24, seed=0, policy_kwargs=SMALL_MODEL
    )
    sampler = RssSampler(SAMPLE_EVERY)
    model.learn(args.steps, callback=sampler)
    sampler.rows.append((model.num_timesteps, rss_bytes(), model.replay_buffer.nbytes()))

    args.out_dir.mkdir(parents=True, exist_ok=True)
    with open(args.out_dir / "soak_rss.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["env_steps", "rss_bytes", "replay_bytes"])
        writer.writerows(sampler.rows)

    steps = np.array([row[0] for row in sampler.rows])
    rss = np.array([row[1] for row in sampler.rows], dtype=float)
    half = rss[np.flatnonzero(steps >= args.steps // 2)[0]]
    full = rss[np.flatnonzero(steps >= BUFFER_SIZE)[0]] if steps[-1] >= BUFFER_SIZE else float("nan")
    growth = rss[-1] / half - 1.0
    replay = model.replay_buffer.nbytes()
    figures = {
        "RSS when the replay is full": {"value": full / 2**20, "unit": "MiB", "at_env_steps": BUFFER_SIZE},
        "RSS at the end": {"value": rss[-1] / 2**20, "unit": "MiB", "at_env_steps": int(steps[-1])},
        "RSS growth over the last half": {
            "value": 100 * growth,
            "unit": "%",
            "flat_below": 100 * FLAT,
            "flat": bool(growth < FLAT),
        },
        "replay storage": {"value": replay / 2**20, "unit": "MiB", "per_transition_bytes": replay / BUFFER_SIZE},
    }
    for name, cost in costs.items():
        figures[f"replay bytes per transition, {name}"] = {
            "value": cost["allocated"],
            "unit": "bytes",
            "payload_bytes": cost["payload"],
            "overhead": cost["allocated"] / cost["payload"] - 1.0,
        }
    config = {
        "env_id": ENV_ID,
        "n_envs": N_ENVS,
        "env_steps": args.steps,
        "buffer_size": BUFFER_SIZE,
        "policy_kwargs": SMALL_MODEL,
        "rss_sample_every": SAMPLE_EVERY,
    }
    write_results("soak", config, figures, args.out_dir)
    print((args.out_dir / "soak.md").read_text())


if __name__ == "__main__":
    main()
