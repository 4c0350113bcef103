"""Data-parallel AMAGO: gradient updates per second and env steps per second with 1 and 2
processes (torchrun, one torch thread each), and how the throughput scales.

Every rank trains the same model on its own batch of 8 windows (L = 64, d_model 64, 2 layers,
discrete actions) and collects with its own 8 envs. Figures are for the whole group: updates/s is
the group's (every rank takes each update), windows/s is updates/s x batch x processes, env
steps/s counts all ranks' envs. The scaling figure is the 2-process throughput over the 1-process
one. Processes share the machine's cores, so a fair measurement needs a quiet machine with at least
as many free cores as processes; on GPUs, one GPU per process (``nccl``), or ``--backend gloo`` to
put both processes on one GPU.

    python benchmarks/bench_distributed.py                   # writes benchmarks/results/distributed.*
    python benchmarks/bench_distributed.py --quick           # a smoke run into distributed_quick.*
    python benchmarks/bench_distributed.py --device cuda     # GPU figures into distributed_cuda.*
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch as th
import torch.distributed as dist
from bench_updates import LongEpisodeEnv
from common import write_results
from stable_baselines3.common.env_util import make_vec_env

from sb3_amago import AMAGO

BATCH = 8
N_ENVS = 8
MAX_SEQ_LEN = 64


def slowest(seconds: float) -> float:
    """The longest time over the ranks (the group is as fast as its slowest rank)."""
    value = th.tensor([seconds], dtype=th.float64)
    if dist.get_backend() == "nccl":
        value = value.cuda()
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def worker(args: argparse.Namespace) -> None:
    """One rank: time collection, then updates; rank 0 writes the group's figures to ``args.result``."""
    if args.backend != "auto":
        dist.init_process_group(args.backend)
    model = AMAGO(
        "TransformerPolicy",
        make_vec_env(LongEpisodeEnv, n_envs=N_ENVS, seed=0),
        max_seq_len=MAX_SEQ_LEN,
        batch_size=BATCH,
        learning_starts=10**9,  # learn() only collects; updates are timed with train()
        buffer_size=200_000,
        seed=0,
        device=args.device,
        distributed=True,
        mixed_precision=args.device == "cuda",
        policy_kwargs={"traj_encoder_kwargs": {"d_model": 64, "n_heads": 4, "d_ff": 256, "n_layers": 2}, "d_embed": 64},
    )
    world = dist.get_world_size()
    model.learn(N_ENVS * (MAX_SEQ_LEN + 16))
    start = time.perf_counter()
    model.learn(N_ENVS * args.collect_steps, reset_num_timesteps=False)
    collect_s = slowest(time.perf_counter() - start)
    model.train(gradient_steps=2, batch_size=BATCH)  # warm-up
    start = time.perf_counter()
    model.train(gradient_steps=args.updates, batch_size=BATCH)
    if args.device == "cuda":
        th.cuda.synchronize()
    update_s = slowest(time.perf_counter() - start)
    if dist.get_rank() == 0:
        figures = {
            "processes": world,
            "updates_per_s": args.updates / update_s,
            "windows_per_s": args.updates * BATCH * world / update_s,
            "env_steps_per_s": N_ENVS * args.collect_steps * world / collect_s,
        }
        Path(args.result).write_text(json.dumps(figures))


def launch(n_procs: int, args: argparse.Namespace, result: Path) -> dict[str, float]:
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(n_procs)]
    command += ["--master_addr", "127.0.0.1", "--master_port", str(29400 + n_procs), __file__, "--worker"]
    command += ["--result", str(result), "--device", args.device, "--backend", args.backend]
    command += ["--updates", str(args.updates), "--collect-steps", str(args.collect_steps)]
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(result.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--backend", default="auto", help="auto (gloo on CPU, nccl on GPUs) or gloo / nccl")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--updates", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--collect-steps", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    th.set_num_threads(1)  # as in every worker, so that the recorded thread count is theirs
    if args.worker:
        worker(args)
        return
    args.updates = 3 if args.quick else 30
    args.collect_steps = 20 if args.quick else 200
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n_procs in (1, 2):
            runs[n_procs] = launch(n_procs, args, Path(tmp) / f"{n_procs}.json")
            print(f"{n_procs} process(es): {runs[n_procs]}")
    figures: dict[str, dict] = {}
    for n_procs, run in runs.items():
        figures[f"updates_per_s_{n_procs}_proc"] = {"value": run["updates_per_s"], "unit": "updates/s"}
        figures[f"windows_per_s_{n_procs}_proc"] = {"value": run["windows_per_s"], "unit": "windows/s"}
        figures[f"env_steps_per_s_{n_procs}_proc"] = {"value": run["env_steps_per_s"], "unit": "env steps/s"}
    figures["scaling_windows_per_s_2_vs_1"] = {"value": runs[2]["windows_per_s"] / runs[1]["windows_per_s"], "unit": "x"}
    figures["scaling_env_steps_per_s_2_vs_1"] = {"value": runs[2]["env_steps_per_s"] / runs[1]["env_steps_per_s"], "unit": "x"}
    config = {
        "batch_size_per_process": BATCH,
        "n_envs_per_process": N_ENVS,
        "max_seq_len": MAX_SEQ_LEN,
        "d_model": 64,
        "n_layers": 2,
        "threads_per_process": 1,
        "device": args.device,
        "backend": args.backend,
        "quick": args.quick,
    }
    name = "distributed" + ("_cuda" if args.device == "cuda" else "") + ("_quick" if args.quick else "")
    write_results(name, config, figures)


if __name__ == "__main__":
    main()
