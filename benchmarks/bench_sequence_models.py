"""Benchmark of the Transformer trajectory encoder: acting with the key/value cache, and training.

(a) Acting: time of one env step for 16 envs with the cache, against recomputing the whole window
    (what an implementation without a cache does), at context 128, 1024 and 8192.
(b) Training: forward + backward time and peak memory (max RSS of a fresh subprocess per size)
    for a batch of 8 sequences of length 256, 1024, 4096 and 10000, with freed memory kept in the
    process as AMAGO keeps it on the CPU (:func:`sb3_amago.cpu_memory.keep_freed_memory`; without
    it, each pass faults its large temporaries in afresh: 3.47 against 3.12 s at L = 4,096).

Writes ``<out-dir>/sequence_models.json`` (configuration, every figure with its unit, the command,
torch version, thread count, CPU model, date) and ``<out-dir>/sequence_models.md``. With
``--quick`` (tiny sizes, to check the script runs) the files are named ``sequence_models_quick.*``.

Usage::

    python benchmarks/bench_sequence_models.py --threads 2
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch as th
from common import run_metadata

from sb3_amago.cpu_memory import keep_freed_memory
from sb3_amago.nets import TransformerTrajEncoder, cpu_kernels

D_MODEL, N_LAYERS, N_HEADS = 128, 3, 8
FULL = {"contexts": [128, 1024, 8192], "n_envs": 16, "step_repeats": 20, "train_lengths": [256, 1024, 4096, 10000], "batch": 8}
QUICK = {"contexts": [16, 32, 64], "n_envs": 4, "step_repeats": 3, "train_lengths": [32, 64], "batch": 2}
# The project's targets for the sequence models, checked on the full run.
MAX_STEP_RATIO_1024_VS_128 = 3.0
MIN_SPEEDUP_AT_8192 = 20.0
MAX_TRAIN_MEMORY_GIB = 16.0


def make_encoder(max_seq_len: int) -> TransformerTrajEncoder:
    return TransformerTrajEncoder(D_MODEL, max_seq_len, d_model=D_MODEL, n_heads=N_HEADS, d_ff=4 * D_MODEL, n_layers=N_LAYERS)


def max_rss_mib() -> float:
    """Peak resident set size of this process so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(fn: Callable[[], object], repeats: int, before: Callable[[], None] = lambda: None) -> list[float]:
    """Wall-clock seconds of ``repeats`` calls of ``fn``; ``before`` runs untimed before each."""
    times = []
    for _ in range(repeats):
        before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


@th.inference_mode()
def bench_acting(context: int, n_envs: int, step_repeats: int) -> dict[str, float]:
    """Per-step seconds with the cache (context ``context``) and when recomputing the window."""
    encoder = make_encoder(context).eval()
    state = encoder.init_state(n_envs, "cpu")
    x, time_idx = th.randn(n_envs, D_MODEL), th.full((n_envs,), context - 1)

    def cached_step() -> None:
        encoder.step(x, time_idx, state)

    def set_context() -> None:
        # Step costs depend on how many slots are attended, not their contents: put every env at
        # its last step before the window is full, so each timed step attends to `context` slots.
        state.count.fill_(context - 1)

    timed(cached_step, 1, set_context)
    cached = timed(cached_step, step_repeats, set_context)

    window = th.randn(n_envs, context, D_MODEL)
    window_time = th.arange(context).expand(n_envs, context)
    real = th.ones(n_envs, context, dtype=th.bool)

    def recompute() -> None:
        encoder(window, window_time, real)

    recompute_repeats = max(1, min(step_repeats, 3 * 1024 // context))
    if context <= 1024:
        timed(recompute, 1)
    recomputed = timed(recompute, recompute_repeats)
    cached_s, recomputed_s = statistics.median(cached), statistics.median(recomputed)
    return {
        "context": context,
        "cached_step_ms": 1e3 * cached_s,
        "cached_step_repeats": len(cached),
        "recompute_step_ms": 1e3 * recomputed_s,
        "recompute_step_repeats": len(recomputed),
        "speedup": recomputed_s / cached_s,
    }


def train_worker(length: int, batch: int) -> dict[str, float]:
    """Forward + backward timing and peak RSS; run in a fresh process so that RSS is its own."""
    cpu_kernels.load()  # as AMAGO does on the CPU: the kernels, then the freed-memory settings
    keep_freed_memory()
    encoder = make_encoder(length).train()
    x = th.randn(batch, length, D_MODEL)
    time_idx = th.arange(length).expand(batch, length)
    real = th.ones(batch, length, dtype=th.bool)
    weights = th.randn(batch, length, D_MODEL)
    baseline = max_rss_mib()

    def forward_backward() -> None:
        encoder.zero_grad(set_to_none=True)
        (encoder(x, time_idx, real) * weights).mean().backward()

    repeats = 3 if length <= 4096 else 2
    timed(forward_backward, 1)
    times = timed(forward_backward, repeats)
    peak = max_rss_mib()
    return {
        "length": length,
        "batch": batch,
        "forward_backward_ms": 1e3 * statistics.median(times),
        "repeats": repeats,
        "peak_rss_mib": peak,
        "peak_rss_increase_mib": peak - baseline,
    }


def bench_training(length: int, batch: int, threads: int) -> dict[str, float]:
    command = [sys.executable, __file__, "--threads", str(threads), "--train-worker", str(length), "--batch", str(batch)]
    result = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def checks(acting: list[dict], training: list[dict]) -> dict[str, dict]:
    """The targets above, evaluated where the run measured the sizes they name."""
    by_context = {row["context"]: row for row in acting}
    by_length = {row["length"]: row for row in training}
    out = {}
    if 128 in by_context and 1024 in by_context:
        ratio = by_context[1024]["cached_step_ms"] / by_context[128]["cached_step_ms"]
        out["cached_step_1024_vs_128"] = {
            "value": ratio,
            "limit": f"< {MAX_STEP_RATIO_1024_VS_128}",
            "ok": ratio < MAX_STEP_RATIO_1024_VS_128,
        }
    if 8192 in by_context:
        speedup = by_context[8192]["speedup"]
        out["speedup_at_8192"] = {"value": speedup, "limit": f">= {MIN_SPEEDUP_AT_8192}", "ok": speedup >= MIN_SPEEDUP_AT_8192}
    if 10000 in by_length:
        gib = by_length[10000]["peak_rss_mib"] / 1024
        out["train_10000_peak_gib"] = {"value": gib, "limit": f"< {MAX_TRAIN_MEMORY_GIB}", "ok": gib < MAX_TRAIN_MEMORY_GIB}
    return out


def markdown(report: dict) -> str:
    lines = [
        "# Sequence model benchmark",
        "",
        f"`{report['command']}`  ",
        f"torch {report['torch_version']}, {report['threads']} threads, {report['cpu_model']}, {report['date']}",
        "",
        (f"## Acting: one step of {report['config']['n_envs']} envs (d_model {D_MODEL}, {N_LAYERS} layers, {N_HEADS} heads)"),
        "",
        "| context | cached step (ms) | recompute window (ms) | speedup |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for row in report["acting"]:
        lines.append(
            f"| {row['context']} | {row['cached_step_ms']:.2f} | {row['recompute_step_ms']:.1f} | {row['speedup']:.1f}x |"
        )
    lines += [
        "",
        f"## Training: forward + backward, batch {report['config']['batch']}",
        "",
        "| length | time (ms) | peak RSS (MiB) | RSS increase (MiB) |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for row in report["training"]:
        lines.append(
            f"| {row['length']} | {row['forward_backward_ms']:.0f} | {row['peak_rss_mib']:.0f} "
            f"| {row['peak_rss_increase_mib']:.0f} |"
        )
    if report["checks"]:
        lines += ["", "## Checks", "", "| check | value | expected | ok |", "| --- | ---: | --- | --- |"]
        for name, check in report["checks"].items():
            lines.append(f"| {name} | {check['value']:.2f} | {check['limit']} | {'yes' if check['ok'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check that the script runs")
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--name", help="the results' file name (default: sequence_models, or sequence_models_quick)")
    parser.add_argument("--train-worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    th.set_num_threads(args.threads)
    th.manual_seed(0)
    if args.train_worker is not None:
        print(json.dumps(train_worker(args.train_worker, args.batch)))
        return

    config = QUICK if args.quick else FULL
    acting = []
    for context in config["contexts"]:
        acting.append(bench_acting(context, config["n_envs"], config["step_repeats"]))
        print(json.dumps(acting[-1]), flush=True)
    training = []
    for length in config["train_lengths"]:
        training.append(bench_training(length, config["batch"], args.threads))
        print(json.dumps(training[-1]), flush=True)

    report = {
        "config": dict(config, d_model=D_MODEL, n_layers=N_LAYERS, n_heads=N_HEADS, d_ff=4 * D_MODEL),
        "units": {
            "cached_step_ms": "milliseconds per env step (all envs), median",
            "recompute_step_ms": "milliseconds per env step (all envs), median",
            "speedup": "recompute_step_ms / cached_step_ms",
            "forward_backward_ms": "milliseconds per forward + backward, median",
            "peak_rss_mib": "MiB, max resident set size of the worker process",
            "peak_rss_increase_mib": "MiB, max RSS minus max RSS before the first forward",
        },
        "acting": acting,
        "training": training,
        "checks": checks(acting, training),
        **run_metadata(),
    }
    name = args.name or ("sequence_models_quick" if args.quick else "sequence_models")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out_dir / f"{name}.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
