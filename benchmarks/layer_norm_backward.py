"""The compiled update with the layer norm's backward as torch's kernel, against inductor's decomposition.

On the CPU ``compile_model=True`` compiles the update with :class:`sb3_amago.compiled_update.CpuInductor`,
whose decomposition table makes each layer norm's backward the operator ``sb3_amago::layer_norm_backward``
(torch's kernel, one pass over each row: ``sb3_amago/nets/layer_norm.py``); plain inductor decomposes it
into two passes. Two measurements:

- alone: torch's kernel and inductor's compiled decomposition of one layer norm's backward at the
  Transformer's feed-forward norm, ``(B * (L + 1), 512)``, each the median of ``--repeats`` calls, with
  warm caches and after a 64 MB pass that flushes them;
- inside the update: two reference models (``bench_updates.trained_model``) in this process, one
  compiled as the package does and one with plain inductor and the same options
  (``compiled_update.inductor_options``), trained alternately for ``--rounds`` rounds of ``--updates``
  updates, each side first in turn: the median of the per-round ratios and the rounds the package's
  side was faster. One process, because this VM's speed moves between processes by more than the change.

    python benchmarks/layer_norm_backward.py --threads 2 --length 64
    python benchmarks/layer_norm_backward.py --threads 2 --length 256 --rounds 12 --updates 4

Results: ``benchmarks/results/layer_norm_backward_L{length}.json`` / ``.md`` (``--name`` changes it).
"""

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch as th
from bench_updates import alternated_update_seconds, trained_model
from common import RESULTS_DIR, write_results

from sb3_amago.compiled_update import inductor_options
from sb3_amago.loss import update_forward

#: The Transformer's feed-forward width at the reference settings (its widest layer norm).
WIDTH = 512
#: Batch of the reference update.
BATCH = 8


def median_us(fn: Callable[[], Any], repeats: int, flush: th.Tensor | None) -> float:
    """The median microseconds of ``fn``, each call after a pass over ``flush`` where given."""
    times = []
    for _ in range(repeats):
        if flush is not None:
            flush.add_(1.0)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def alone(length: int, repeats: int) -> dict[str, dict[str, Any]]:
    """torch's layer-norm backward and inductor's decomposition of it (compiled, its three gradients) at
    ``(BATCH * (length + 1), WIDTH)``, warm and flushed."""
    rows = BATCH * (length + 1)
    generator = th.Generator().manual_seed(0)
    x, grad = th.randn(rows, WIDTH, generator=generator), th.randn(rows, WIDTH, generator=generator)
    weight, bias = th.randn(WIDTH, generator=generator), th.randn(WIDTH, generator=generator)
    _, mean, rstd = th.ops.aten.native_layer_norm(x, [WIDTH], weight, bias, 1e-5)

    def decomposed(grad: th.Tensor, x: th.Tensor, mean: th.Tensor, rstd: th.Tensor, weight: th.Tensor) -> Any:
        return th.ops.aten.native_layer_norm_backward(grad, x, [WIDTH], mean, rstd, weight, bias, [True, True, True])

    inductor = th.compile(decomposed, dynamic=True, options=inductor_options(th.device("cpu")))
    sides = {
        "torch_kernel": lambda: th.ops.aten.native_layer_norm_backward(
            grad, x, [WIDTH], mean, rstd, weight, bias, [True, True, True]
        ),
        "inductor_decomposition": lambda: inductor(grad, x, mean, rstd, weight),
    }
    flush = th.empty(16 * 2**20)
    figures = {}
    for name, fn in sides.items():
        for _ in range(3):
            fn()
        for cache, buffer in (("warm", None), ("flushed", flush)):
            figures[f"alone_{name}_{cache}_us"] = {
                "value": round(median_us(fn, repeats, buffer), 1),
                "unit": f"us, median of {repeats} calls, ({rows}, {WIDTH})",
            }
    return figures


def inside_updates(length: int, rounds: int, updates: int) -> dict[str, dict[str, Any]]:
    """Per-round update times of the package's compiled update and plain inductor's, alternated."""
    package = trained_model(length, compile_model=True)
    plain = trained_model(length, compile_model=False)
    plain._update_forward = th.compile(update_forward, dynamic=True, options=inductor_options(th.device("cpu")))
    models = {"package": package, "plain_inductor": plain}
    for model in models.values():
        model.train(gradient_steps=updates, batch_size=BATCH)
    seconds = alternated_update_seconds(models, rounds, updates)
    ratios = [p / n for p, n in zip(seconds["plain_inductor"], seconds["package"], strict=True)]
    return {
        "update_ms_package": {"value": round(1e3 * statistics.median(seconds["package"]), 2), "unit": "ms (median)"},
        "update_ms_plain_inductor": {
            "value": round(1e3 * statistics.median(seconds["plain_inductor"]), 2),
            "unit": "ms (median)",
        },
        "update_speedup": {
            "value": round(statistics.median(ratios), 4),
            "unit": "x (median of per-round plain / package update times)",
            "rounds_faster": sum(ratio > 1 for ratio in ratios),
            "rounds": rounds,
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=300, help="calls per side alone")
    parser.add_argument("--rounds", type=int, default=30, help="alternations inside the update")
    parser.add_argument("--updates", type=int, default=10, help="updates per round and side")
    parser.add_argument("--name", default=None)
    args = parser.parse_args()
    th.set_num_threads(args.threads)
    figures = {**alone(args.length, args.repeats), **inside_updates(args.length, args.rounds, args.updates)}
    for key, figure in figures.items():
        print(f"{key}: {figure['value']} {figure['unit']}")
    config = {"length": args.length, "repeats": args.repeats, "rounds": args.rounds, "updates_per_round": args.updates}
    write_results(args.name or f"layer_norm_backward_L{args.length}", config, figures, out_dir=RESULTS_DIR)


if __name__ == "__main__":
    main()
