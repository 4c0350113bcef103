"""Gradient updates per second, collection throughput and acting latency of AMAGO on CPU.

Reference configuration: batch 8 sequences, windows of L = 64 and L = 256, d_model 128,
3 layers, 8 heads, 4 critics, 19 discount factors, discrete actions, fp32. The original AMAGO
implementation measured 9.6 updates/s at L = 64 and 2.8 at L = 256 on a 2-core machine of this
kind (eager); the target is at least twice that. Also measured: env steps per second while
collecting with 16 envs and the key/value cache, per-step acting latency, and the share of replay
sampling in one training step at batch 24 x window 1,024.

    python benchmarks/bench_updates.py --threads 2            # full run, writes benchmarks/results/updates.*
    python benchmarks/bench_updates.py --threads 2 --quick    # a smoke run into updates_quick.*
    python benchmarks/bench_updates.py --device cuda          # on a GPU, also L = 1,024 and the compiled
                                                              # sequence model: updates_cuda.*
"""

import argparse
import time

import gymnasium as gym
import numpy as np
import torch as th
from common import write_results
from gymnasium import spaces
from stable_baselines3.common.env_util import make_vec_env

from sb3_amago import AMAGO

# 18 extra discount factors + the main 0.999 = 19 heads: the paper's discrete-action set plus 0.5, 0.8.
MULTIGAMMAS = (
    0.5,
    0.7,
    0.8,
    0.9,
    0.93,
    0.95,
    0.98,
    0.99,
    0.992,
    0.994,
    0.995,
    0.997,
    0.998,
    0.9991,
    0.9992,
    0.9993,
    0.9994,
    0.9995,
)
REFERENCE_UPDATES_PER_S = {64: 9.6, 256: 2.8}


class LongEpisodeEnv(gym.Env):
    """16 float features, 4 actions, rewards at random, 2,000-step episodes: windows are always full."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(16,), dtype=np.float32)
        self.action_space = spaces.Discrete(4)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), float(self.np_random.random() < 0.1), False, self.t >= 2_000, {}


def make_model(n_envs: int, max_seq_len: int, buffer_size: int, device: str = "cpu", compile_model: bool = False) -> AMAGO:
    env = make_vec_env(LongEpisodeEnv, n_envs=n_envs, seed=0)
    return AMAGO(
        "TransformerPolicy",
        env,
        max_seq_len=max_seq_len,
        multigammas=MULTIGAMMAS,
        buffer_size=buffer_size,
        learning_starts=10**9,  # collection only acts; updates are timed separately
        batch_size=8,
        seed=0,
        device=device,
        compile_model=compile_model,
        policy_kwargs={"traj_encoder_kwargs": {"d_model": 128, "n_heads": 8, "d_ff": 512, "n_layers": 3}, "d_embed": 128},
    )


def updates_per_second(
    max_seq_len: int, n_updates: int, mixed_precision: bool = False, device: str = "cpu", compile_model: bool = False
) -> float:
    model = make_model(4, max_seq_len, 50_000, device, compile_model)
    model.mixed_precision = mixed_precision
    model.learn(4 * (max_seq_len + 64))
    model.train(gradient_steps=3, batch_size=8)  # warm-up (and compilation)
    synchronize = th.cuda.synchronize if model.device.type == "cuda" else lambda: None
    synchronize()
    start = time.perf_counter()
    model.train(gradient_steps=n_updates, batch_size=8)
    synchronize()
    return n_updates / (time.perf_counter() - start)


def collection(n_envs: int, steps: int) -> dict[str, float]:
    model = make_model(n_envs=n_envs, max_seq_len=256, buffer_size=200_000)
    model.learn(n_envs * 4)
    start = time.perf_counter()
    model.learn(n_envs * steps, reset_num_timesteps=False)
    elapsed = time.perf_counter() - start
    obs = model.env.reset()
    state, latencies = None, []
    for _ in range(steps):
        t0 = time.perf_counter()
        action, state = model.predict(obs, state=state, deterministic=False)
        latencies.append(time.perf_counter() - t0)
        obs, *_ = model.env.step(action)
    return {"env_steps_per_s": n_envs * steps / elapsed, "predict_ms_16_envs_median": 1e3 * float(np.median(latencies))}


def sampling_share(window: int, n_updates: int) -> dict[str, float]:
    model = make_model(n_envs=4, max_seq_len=window, buffer_size=100_000)
    model.learn(4 * (window + 200))
    model.train(gradient_steps=1, batch_size=24)
    start = time.perf_counter()
    for _ in range(n_updates):
        model.replay_buffer.sample(24)
    sample_s = (time.perf_counter() - start) / n_updates
    start = time.perf_counter()
    model.train(gradient_steps=n_updates, batch_size=24)
    step_s = (time.perf_counter() - start) / n_updates
    return {"sample_ms": 1e3 * sample_s, "train_step_ms": 1e3 * step_s, "sampling_share": sample_s / step_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args()
    th.set_num_threads(args.threads)
    if args.device != "cpu":
        gpu_figures(args.threads, n=5 if args.quick else 50)
        return
    n = 3 if args.quick else 20
    figures: dict[str, dict] = {}
    for length in (64, 256):
        ups = updates_per_second(length, n)
        figures[f"updates_per_s_L{length}"] = {
            "value": ups,
            "unit": "updates/s",
            "original_amago": REFERENCE_UPDATES_PER_S[length],
            "ratio_vs_original": ups / REFERENCE_UPDATES_PER_S[length],
        }
        print(f"L={length}: {ups:.2f} updates/s")
        bf16 = updates_per_second(length, n, mixed_precision=True)
        figures[f"updates_per_s_L{length}_bf16_autocast"] = {"value": bf16, "unit": "updates/s", "ratio_vs_fp32": bf16 / ups}
        print(f"L={length} bf16 autocast: {bf16:.2f} updates/s")
    coll = collection(n_envs=16, steps=20 if args.quick else 200)
    figures["collect_env_steps_per_s_16_envs"] = {"value": coll["env_steps_per_s"], "unit": "env steps/s"}
    figures["predict_latency_16_envs"] = {"value": coll["predict_ms_16_envs_median"], "unit": "ms per call (median)"}
    print(coll)
    share = sampling_share(window=64 if args.quick else 1024, n_updates=2 if args.quick else 5)
    figures["replay_sampling_share_B24_W1024"] = {
        "value": share["sampling_share"],
        "unit": "fraction of one training step",
        **share,
    }
    print(share)
    config = {
        "batch_size": 8,
        "d_model": 128,
        "n_layers": 3,
        "n_heads": 8,
        "n_critics": 4,
        "n_gammas": len(MULTIGAMMAS) + 1,
        "actions": "Discrete(4)",
        "precision": "fp32",
        "threads": args.threads,
        "quick": args.quick,
    }
    write_results("updates_quick" if args.quick else "updates", config, figures)


def gpu_figures(threads: int, n: int) -> None:
    """Updates per second on the GPU at L = 64, 256 and 1,024 in fp32 and bf16 autocast, and at L = 256
    with the compiled sequence model too (``updates_cuda.*``)."""
    figures: dict[str, dict] = {}
    modes = {"fp32": (False, False), "bf16": (True, False), "bf16_compiled": (True, True)}
    for length, label in [
        (64, "fp32"),
        (64, "bf16"),
        (256, "fp32"),
        (256, "bf16"),
        (256, "bf16_compiled"),
        (1024, "fp32"),
        (1024, "bf16"),
    ]:
        bf16, compiled = modes[label]
        ups = updates_per_second(length, n, mixed_precision=bf16, device="cuda", compile_model=compiled)
        figures[f"updates_per_s_L{length}_{label}"] = {"value": ups, "unit": "updates/s"}
        print(f"L={length} {label}: {ups:.2f} updates/s", flush=True)
    config = {"batch_size": 8, "d_model": 128, "n_layers": 3, "n_heads": 8, "n_gammas": len(MULTIGAMMAS) + 1}
    write_results("updates_cuda", {**config, "device": th.cuda.get_device_name(), "threads": threads}, figures)


if __name__ == "__main__":
    main()
