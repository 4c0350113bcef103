"""The compiled update with the layer norm's backward as torch's kernel, against inductor's decomposition.

On the CPU ``compile_model=True`` compiles the update with :class:`sb3_amago.compiled_update.CpuInductor`,
whose decomposition table makes each layer norm's backward the operator ``sb3_amago::layer_norm_backward``
(torch's kernel, one pass over each row: ``sb3_amago/nets/layer_norm.py``); plain inductor decomposes it
into two passes. Two measurements:

- alone: torch's kernel and inductor's compiled decomposition of one layer norm's backward at the
  Transformer's feed-forward norm, ``(B * (L + 1), 512)``, each the median of ``--repeats`` calls, with
  warm caches and after a 64 MB pass that flushes them;
- inside the update: the package's compiled update against the same without the table's layer-norm
  entry, whose graph then decomposes the backward as inductor does, alternated in one process
  (``table_entries.py``): the median of the per-round ratios and the rounds the package's side was
  faster.

    python benchmarks/layer_norm_backward.py --threads 2 --length 64
    python benchmarks/layer_norm_backward.py --threads 2 --length 256 --rounds 12 --updates 4

Results: ``benchmarks/results/layer_norm_backward_L{length}.json`` / ``.md`` (``--name`` changes it).
"""

import statistics
import time
from collections.abc import Callable
from typing import Any

import table_entries
import torch as th
from bench_updates import alternation_parser
from common import RESULTS_DIR, print_and_write

from sb3_amago.compiled_update import inductor_options

#: The Transformer's feed-forward width at the reference settings (its widest layer norm).
WIDTH = 512
#: Batch of the reference update.
BATCH = 8
#: The operator whose entry in the package's table this benchmark is about.
LAYER_NORM_BACKWARD = th.ops.aten.native_layer_norm_backward.default


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


def main() -> None:
    parser = alternation_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=300, help="calls per side alone")
    args = parser.parse_args()
    th.set_num_threads(args.threads)
    inside = table_entries.inside_updates(args.length, args.rounds, args.updates, [str(LAYER_NORM_BACKWARD)])
    figures = {**alone(args.length, args.repeats), **inside}
    config = {"length": args.length, "repeats": args.repeats, "rounds": args.rounds, "updates_per_round": args.updates}
    print_and_write(args.name or f"layer_norm_backward_L{args.length}", config, figures, RESULTS_DIR)


if __name__ == "__main__":
    main()
