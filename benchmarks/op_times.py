"""Where an update's time goes, operator by operator, timed at the dispatcher.

Every ATen operator that one update of the reference model (``bench_updates.py``) calls, forward,
backward and optimizer, runs under a ``TorchDispatchMode`` that times the call with
``time.perf_counter``. The totals per operator and per input shape add up to the update's operator
time; the rest of the update's wall-clock is Python and dispatch. Timed this way, a large
elementwise operator costs what it costs when run alone (torch.profiler's table gave the critics'
leaky ReLU 5.7 ms a call on an AMD EPYC where it takes 0.13 ms), so these shares are the ones to
optimise against. The timer adds a few microseconds a call, so the timed update runs slower than
the plain one printed beside it.

    python benchmarks/op_times.py --length 64 --threads 1
    python benchmarks/op_times.py --length 256 --threads 1 --updates 3
    python benchmarks/op_times.py --length 64 --threads 2 --name op_times_L64_2threads
    python benchmarks/op_times.py --length 64 --threads 2 --precision bf16 --name op_times_L64_bf16

Results: ``benchmarks/results/op_times_L<length>.json`` / ``.md`` (``--name`` changes the file name): the plain and timed update,
the matrix products' share of operator time (the products ``bench_updates.MATRIX_OPS`` lists), and
the operators above 1% of it.
"""

import argparse
import collections
import os
import time
from typing import Any

import torch as th
from bench_updates import MATRIX_OPS, WARM_UP_UPDATES, trained_model
from common import write_results
from torch.utils._python_dispatch import TorchDispatchMode


class OperatorTimer(TorchDispatchMode):
    """Seconds and calls per operator and per (operator, first input's shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()
        self.by_shape: collections.Counter = collections.Counter()
        self.matrix_seconds = 0.0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        elapsed = time.perf_counter() - start
        name = str(func.overloadpacket.__name__)
        first = args[0] if args and isinstance(args[0], th.Tensor) else None
        self.seconds[name] += elapsed
        self.calls[name] += 1
        self.by_shape[(name, tuple(first.shape) if first is not None else ())] += elapsed
        if func in MATRIX_OPS:
            self.matrix_seconds += elapsed
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=64, help="window length L")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--updates", type=int, default=10, help="updates timed (plain, then under the timer)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16: under bf16 autocast")
    parser.add_argument("--name", default=None, help="results file name (default: op_times_L<length>)")
    args = parser.parse_args()
    th.set_num_threads(args.threads)
    model = trained_model(args.length, mixed_precision=args.precision == "bf16")
    # The process's heap grows for about 20 updates (fresh pages fault in), then stays: time after that.
    model.train(gradient_steps=WARM_UP_UPDATES, batch_size=8)
    start = time.perf_counter()
    model.train(gradient_steps=args.updates, batch_size=8)
    plain = (time.perf_counter() - start) / args.updates
    timer = OperatorTimer()
    with timer:
        start = time.perf_counter()
        model.train(gradient_steps=args.updates, batch_size=8)
        timed = (time.perf_counter() - start) / args.updates
    operator_s = sum(timer.seconds.values()) / args.updates
    figures: dict[str, dict[str, Any]] = {
        "update_ms": {"value": plain * 1e3, "unit": "ms (no timer)"},
        "timed_update_ms": {"value": timed * 1e3, "unit": "ms (under the timer)"},
        "operator_ms": {
            "value": operator_s * 1e3,
            "unit": "ms of operators per timed update",
            "calls_per_update": sum(timer.calls.values()) // args.updates,
        },
        "matrix_share": {"value": timer.matrix_seconds / args.updates / operator_s, "unit": "fraction of operator time"},
        # The timer adds microseconds per call: the ~80 matrix products keep their time, the update
        # around them is taken untimed, so this is the share of a plain update outside them.
        "outside_matrix_share": {
            "value": 1.0 - timer.matrix_seconds / args.updates / plain,
            "unit": "fraction of an untimed update",
            "matrix_ms": timer.matrix_seconds / args.updates * 1e3,
        },
    }
    for name, seconds in timer.seconds.most_common():
        share = seconds / args.updates / operator_s
        if share < 0.01:
            break
        figures[f"op_{name}"] = {
            "value": seconds / args.updates * 1e3,
            "unit": "ms per update",
            "share": share,
            "calls_per_update": timer.calls[name] // args.updates,
        }
    for (name, shape), seconds in timer.by_shape.most_common(8):
        figures[f"shape_{name}_{'x'.join(map(str, shape))}"] = {"value": seconds / args.updates * 1e3, "unit": "ms per update"}
    for key, figure in figures.items():
        print(f"{key:45s} {figure['value']:9.3f} {figure['unit']}")
    config = {
        "max_seq_len": args.length,
        "batch_size": 8,
        "threads": args.threads,
        "precision": args.precision,
        "updates": args.updates,
        "load_average": os.getloadavg()[0],
    }
    write_results(args.name or f"op_times_L{args.length}", config, figures)


if __name__ == "__main__":
    main()
