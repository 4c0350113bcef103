"""Up to which window the training pass's causal attention is faster on torch's math backend than
on its flash kernel, on this CPU: the evidence for ``CPU_MATH_ATTENTION_MAX_STEPS``.

Where the package's own CPU kernels are not built (``sb3_amago/nets/cpu_kernels.py``),
``torch_causal_attention`` (``sb3_amago/nets/transformer.py``) computes the training pass's attention
with the math backend (batched products and a softmax, which ``torch.compile`` fuses) up to
``CPU_MATH_ATTENTION_MAX_STEPS`` steps and with the flash kernel above. Which is faster depends on
the CPU, so this measures it: for each window ``L`` (``L + 1`` steps: a window's timesteps and the
one before them), one process builds the reference update (``bench_updates.py``) twice, one copy
traced and run with the threshold lifted (the math backend) and one with it at 0 (the flash
kernel), and times them alternately, the order swapped every round, so each round's ratio holds
while the machine's speed drifts. Per window: each side's median updates/s, the median of the
per-round ratios math / flash and the rounds in which the math backend was faster. Then the
largest step count up to which the math backend's median ratio is above 1 at every measured
window, beside the package's value: where they disagree on a CPU, the package's value is to be
reconsidered (with windows between the two measured).

    python benchmarks/attention_threshold.py --threads 2 --compile
    python benchmarks/attention_threshold.py --threads 2 --lengths 64 128 --rounds 20 --name attention_threshold_eager

Results: ``benchmarks/results/attention_threshold.json`` / ``.md`` (``--name`` changes the file name).
"""

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bench_updates
import torch as th
from common import write_results

from sb3_amago.nets import cpu_kernels, transformer

#: The two sides: the threshold each copy of the model runs with.
BACKENDS = {"math": 10**9, "flash": 0}


@contextlib.contextmanager
def torch_backend(name: str) -> Iterator[None]:
    """Within the block, the training pass's attention runs on torch's backend ``name`` (the
    package's own CPU kernel, which runs in place of both where it is built, is set aside)."""
    with (
        bench_updates.module_settings(cpu_kernels, CHOICE="torch"),
        bench_updates.module_settings(transformer, CPU_MATH_ATTENTION_MAX_STEPS=BACKENDS[name]),
    ):
        yield


def backend_rates(length: int, rounds: int, updates: int, compile_model: bool) -> dict[str, list[float]]:
    """Updates/s of the reference update at window ``length`` per round, on each backend, both
    models in this process (the module setting switched around each one's updates)."""
    models = {}
    for name in BACKENDS:
        with torch_backend(name):
            models[name] = bench_updates.trained_model(length, compile_model=compile_model)
            models[name].train(gradient_steps=bench_updates.WARM_UP_UPDATES, batch_size=8)
    seconds = bench_updates.alternated_update_seconds(models, rounds, updates, torch_backend)
    return {name: [1.0 / s for s in per_update] for name, per_update in seconds.items()}


def window_figures(length: int, rates: dict[str, list[float]]) -> dict[str, Any]:
    """One window's figure: the median per-round ratio math / flash, with the medians beside it."""
    ratios = [m / f for m, f in zip(rates["math"], rates["flash"])]
    return {
        "value": round(statistics.median(ratios), 4),
        "unit": "x (math backend over flash kernel, median of per-round updates/s ratios)",
        "steps": length + 1,
        "math_median_updates_per_s": round(statistics.median(rates["math"]), 3),
        "flash_median_updates_per_s": round(statistics.median(rates["flash"]), 3),
        "rounds_math_faster": f"{sum(r > 1 for r in ratios)}/{len(ratios)}",
        "ratios": [round(r, 4) for r in ratios],
    }


def math_faster_up_to(figures: dict[str, dict[str, Any]]) -> int:
    """The largest step count up to which the math backend's median ratio is above 1 at every
    measured window (0 where it is not at the shortest)."""
    best = 0
    for figure in sorted(figures.values(), key=lambda f: f["steps"]):
        if figure["value"] <= 1.0:
            break
        best = figure["steps"]
    return best


def measure_in_fresh_process(length: int, args: argparse.Namespace) -> dict[str, list[float]]:
    """:func:`backend_rates` for one window in a fresh process (its own compilation and caches)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--one-window", str(length), "--threads", str(args.threads)]
    command += ["--rounds", str(args.rounds), "--updates", str(args.updates)] + (["--compile"] if args.compile else [])
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 128, 192, 256], help="windows L (L + 1 steps)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--updates", type=int, default=10, help="timed updates per model per round")
    parser.add_argument("--compile", action="store_true", help="the compiled update (compile_model=True)")
    parser.add_argument("--name", default="attention_threshold")
    parser.add_argument("--one-window", type=int, default=None, help=argparse.SUPPRESS)  # the measuring process
    args = parser.parse_args()
    if args.one_window is not None:
        th.set_num_threads(args.threads)
        print(json.dumps(backend_rates(args.one_window, args.rounds, args.updates, args.compile)))
        return
    figures: dict[str, dict[str, Any]] = {}
    loads = []
    for length in args.lengths:
        loads.append(os.getloadavg()[0])
        figures[f"math_over_flash_L{length}"] = figure = window_figures(length, measure_in_fresh_process(length, args))
        print(f"L = {length} ({length + 1} steps): {figure}", flush=True)
    figures["math_faster_up_to_steps"] = {
        "value": math_faster_up_to(figures),
        "unit": "steps (the largest measured attention length up to which the math backend was faster at every window)",
        "package_cpu_math_attention_max_steps": transformer.CPU_MATH_ATTENTION_MAX_STEPS,
    }
    config = {
        "threads": args.threads,
        "compile_model": args.compile,
        "rounds": args.rounds,
        "updates_per_round": args.updates,
        "batch_size": 8,
        "load_average_range": f"{min(loads):.2f}-{max(loads):.2f}",
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"),
    }
    write_results(args.name, config, figures)


if __name__ == "__main__":
    main()
