"""Replay sampling throughput: windows of ``max_seq_len + 1`` steps from a large trajectory buffer.

Default (the lead runs it, alone on the machine): 1,000,000 transitions from 24 envs, rollouts of
500-5000 steps, observations ``{"observation": 64 floats, "prev_reward": 1 float}``, Discrete(6)
actions, batches of 24 windows with ``max_seq_len`` 1024 (up to 1025 observations each).

    python benchmarks/bench_replay.py [--threads 2] [--quick] [--device cpu] [--out benchmarks/results]

Writes ``<out>/replay.json`` (configuration, figures with units, command, versions, CPU, date) and
``<out>/replay.md``. :func:`sample_ms` times any buffer and is meant to be reused.
"""

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch as th
from common import run_metadata
from gymnasium import spaces

from sb3_amago.buffers import TrajectoryReplayBuffer

FULL = {"buffer_size": 1_000_000, "n_envs": 24, "min_len": 500, "max_len": 5000, "max_seq_len": 1024, "n_batches": 50}
QUICK = {"buffer_size": 20_000, "n_envs": 4, "min_len": 50, "max_len": 500, "max_seq_len": 128, "n_batches": 5}
OBS_FEATURES = 64
N_ACTIONS = 6


def sample_ms(buffer: TrajectoryReplayBuffer, batch_size: int, n_batches: int, warmup: int = 3) -> np.ndarray:
    """Wall-clock milliseconds of each of ``n_batches`` ``buffer.sample(batch_size)`` calls, after ``warmup`` untimed ones."""
    for _ in range(warmup):
        buffer.sample(batch_size)
    times = np.empty(n_batches)
    for i in range(n_batches):
        start = time.perf_counter()
        buffer.sample(batch_size)
        times[i] = (time.perf_counter() - start) * 1e3
    return times


def filled_buffer(config: dict, device: str, seed: int = 0) -> tuple[TrajectoryReplayBuffer, float]:
    """A buffer filled to capacity through ``add`` with scripted rollouts; also the seconds the filling took."""
    rng = np.random.default_rng(seed)
    n_envs = config["n_envs"]
    observation_space = spaces.Dict(
        {
            "observation": spaces.Box(-np.inf, np.inf, (OBS_FEATURES,), np.float32),
            "prev_reward": spaces.Box(-np.inf, np.inf, (1,), np.float32),
        }
    )
    buffer = TrajectoryReplayBuffer(
        config["buffer_size"],
        observation_space,
        spaces.Discrete(N_ACTIONS),
        device=device,
        n_envs=n_envs,
        max_seq_len=config["max_seq_len"],
    )
    pool = rng.standard_normal((257, n_envs, OBS_FEATURES), dtype=np.float32)
    lengths = rng.integers(config["min_len"], config["max_len"] + 1, size=n_envs)
    t = np.zeros(n_envs, dtype=np.int64)
    prev_reward = np.zeros((n_envs, 1), dtype=np.float32)
    start = time.perf_counter()
    for step in range(config["buffer_size"] // n_envs):
        reward = rng.standard_normal(n_envs).astype(np.float32)
        done = t + 1 >= lengths
        obs = {"observation": pool[step % len(pool)], "prev_reward": prev_reward}
        next_obs = {"observation": pool[(step + 1) % len(pool)], "prev_reward": reward[:, None]}
        infos = [{"TimeLimit.truncated": bool(d)} for d in done]
        buffer.add(obs, next_obs, rng.integers(0, N_ACTIONS, size=(n_envs, 1)), reward, done, infos)
        t = np.where(done, 0, t + 1)
        lengths = np.where(done, rng.integers(config["min_len"], config["max_len"] + 1, size=n_envs), lengths)
        prev_reward = np.where(done[:, None], 0.0, reward[:, None]).astype(np.float32)
    return buffer, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--quick", action="store_true", help="a small buffer, to check the script works")
    parser.add_argument("--device", default="cpu", help="device of the sampled tensors")
    parser.add_argument("--batch-size", type=int, default=24)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    th.set_num_threads(args.threads)
    np.random.seed(0)
    config = dict(QUICK if args.quick else FULL, batch_size=args.batch_size, device=args.device, quick=args.quick)

    buffer, fill_s = filled_buffer(config, args.device)
    times = sample_ms(buffer, args.batch_size, config["n_batches"])
    steps_per_batch = float(buffer.sample(args.batch_size).real.sum())
    median_s = float(np.median(times)) / 1e3
    figures = {
        "sample_ms_median": {"value": float(np.median(times)), "unit": "ms per batch"},
        "sample_ms_mean": {"value": float(np.mean(times)), "unit": "ms per batch"},
        "sample_ms_p90": {"value": float(np.percentile(times, 90)), "unit": "ms per batch"},
        "windows_per_s": {"value": args.batch_size / median_s, "unit": "sampled windows per second (median batch)"},
        "steps_per_s": {"value": steps_per_batch / median_s, "unit": "real (unpadded) timesteps per second (median batch)"},
        "fill_transitions_per_s": {"value": config["buffer_size"] / fill_s, "unit": "transitions added per second"},
        "replay_bytes": {"value": buffer.nbytes(), "unit": "bytes held by the buffer"},
        "rollouts": {"value": buffer.num_rollouts(), "unit": "rollouts in the buffer"},
    }
    result = {
        "benchmark": "replay",
        "config": {
            **config,
            "window_observations": config["max_seq_len"] + 1,
            "obs_features": OBS_FEATURES + 1,
            "n_actions": N_ACTIONS,
        },
        "figures": figures,
        "numpy": np.__version__,
        **run_metadata(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "replay.json").write_text(json.dumps(result, indent=2) + "\n")
    rows = "\n".join(f"| {name} | {figure['value']:.6g} | {figure['unit']} |" for name, figure in figures.items())
    (args.out / "replay.md").write_text(
        f"# Replay sampling{' (quick)' if args.quick else ''}\n\n"
        f"Batch {args.batch_size} x max_seq_len {config['max_seq_len']} from {config['buffer_size']:,} transitions "
        f"({config['n_envs']} envs, rollouts {config['min_len']}-{config['max_len']} steps), device {args.device}, "
        f"{result['threads']} torch threads, {result['cpu_model']}, torch {th.__version__}, {result['date']}.\n\n"
        f"| figure | value | unit |\n|---|---|---|\n{rows}\n\n`{result['command']}`\n"
    )
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
