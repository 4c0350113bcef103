"""Which library computes the update's fp32 matrix products faster on this CPU: oneDNN or torch's BLAS.

The reference update (``bench_updates.py``, fp32, eager) runs once with its products on oneDNN
(``sb3_amago.nets.cpu_matmul``) under a recorder; each product (the layers' forwards, and their
backward products for the input and the weight, at the update's shapes and strides) is then replayed
on fresh tensors by both libraries: ``sb3_amago::onednn_linear`` and ``F.linear`` on the same
operands, which torch sends to its BLAS (MKL in its x86 builds). Reported per library: the seconds
one update's products take (best of ``--repeats``), their GFLOP/s, and a 2,048-cubed product, with
the speed-up of oneDNN over the BLAS beside each, and the choice ``SB3_AMAGO_CPU_MATMUL=auto``
makes on this CPU. The attention kernels are torch's either way and are not part of this.

    python benchmarks/cpu_matmul.py --threads 2
    python benchmarks/cpu_matmul.py --threads 1 --length 256 --name cpu_matmul_L256_1thread

Results: ``benchmarks/results/cpu_matmul.json`` / ``.md`` (``--name`` changes the file name).
"""

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import torch as th
from bench_updates import MatrixOpRecorder, TensorSpec, trained_model
from common import write_results
from torch.nn import functional as F

from sb3_amago.nets import cpu_matmul

Product = tuple[TensorSpec, TensorSpec, TensorSpec | None]


def recorded_products(length: int) -> list[Product]:
    """The ``(x, weight, bias)`` specs of every routed product of one fp32 update at window ``length``."""
    routed = cpu_matmul.ONEDNN
    cpu_matmul.ONEDNN = True
    try:
        model = trained_model(length, mixed_precision=False)
        recorder = MatrixOpRecorder()
        with recorder:
            model.train(gradient_steps=1, batch_size=8)
    finally:
        cpu_matmul.ONEDNN = routed
    op = th.ops.sb3_amago.onednn_linear.default
    return [args for func, args, _ in recorder.calls if func is op]


def best_seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up: oneDNN builds and caches a kernel per shape on its first call
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def replay(products: list[Product], repeats: int) -> dict[str, float]:
    """Seconds for one pass over ``products`` with each library, on the same fresh operands."""
    operands = [(x.make(), w.make(), None if b is None else b.make()) for x, w, b in products]

    def run(fn: Callable[..., th.Tensor]) -> Callable[[], None]:
        def one_pass() -> None:
            for x, w, b in operands:
                fn(x, w, b)

        return one_pass

    return {
        "onednn": best_seconds(run(th.ops.sb3_amago.onednn_linear), repeats),
        "blas": best_seconds(run(F.linear), repeats),
    }


def flops(products: list[Product]) -> float:
    return float(sum(2 * th.Size(x.shape).numel() * w.shape[0] for x, w, _ in products))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--length", type=int, default=64, help="window length L of the reference update")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--name", default="cpu_matmul")
    args = parser.parse_args()
    th.set_num_threads(args.threads)
    if not cpu_matmul._onednn_available():
        raise SystemExit("this torch build has no oneDNN (torch.backends.mkldnn.is_available() is False): nothing to compare")
    products = recorded_products(args.length)
    seconds = replay(products, args.repeats)
    update_flops = flops(products)
    size = 2048
    a, b = th.randn(size, size), th.randn(size, size)
    square = {
        "onednn": best_seconds(lambda: th.ops.sb3_amago.onednn_linear(a, b, None), args.repeats),
        "blas": best_seconds(lambda: F.linear(a, b), args.repeats),
    }
    figures: dict[str, dict[str, Any]] = {}
    for library in ("onednn", "blas"):
        figures[f"update_products_{library}"] = {
            "value": 1e3 * seconds[library],
            "unit": f"ms per update (L = {args.length}, {len(products)} products)",
            "gflops": update_flops / seconds[library] / 1e9,
        }
        figures[f"square_{library}"] = {"value": 2 * size**3 / square[library] / 1e9, "unit": f"GFLOP/s ({size}-cubed)"}
    figures["onednn_speedup_update_products"] = {
        "value": seconds["blas"] / seconds["onednn"],
        "unit": "x (BLAS time / oneDNN time)",
    }
    figures["onednn_speedup_square"] = {"value": square["blas"] / square["onednn"], "unit": "x"}
    for name, figure in figures.items():
        print(f"{name}: {figure}")
    choice = "onednn" if cpu_matmul.onednn_matmul_chosen() else "blas"
    print(f"{cpu_matmul.ENV_VARIABLE} ({os.environ.get(cpu_matmul.ENV_VARIABLE, 'auto')}) picks {choice} here")
    config = {
        "threads": args.threads,
        "length": args.length,
        "repeats": args.repeats,
        "gflop_per_update": update_flops / 1e9,
        "choice_here": f"{os.environ.get(cpu_matmul.ENV_VARIABLE, 'auto')} -> {choice}",
    }
    write_results(args.name, config, figures)


if __name__ == "__main__":
    main()
