"""Which library computes the update's fp32 matrix products faster on this CPU: oneDNN or torch's BLAS.

The reference update (``bench_updates.py``, fp32, eager) runs once with its products on oneDNN
(``sb3_amago.nets.cpu_matmul``) under a recorder; each product (the layers' forwards, and their
backward products for the input and the weight, at the update's shapes and strides) is then replayed
on fresh tensors by both libraries (``bench_updates.replay_seconds``): ``sb3_amago::onednn_linear``
and ``F.linear`` on operands of the same shapes and strides, which torch sends to its BLAS (MKL in its x86 builds). Reported per library: the seconds
one update's products take (best of ``--repeats``), their GFLOP/s, and a 2,048-cubed product, with
the speed-up of oneDNN over the BLAS beside each, and the choice ``SB3_AMAGO_CPU_MATMUL=auto``
makes on this CPU. The attention kernels are torch's either way and are not part of this.

A replay leaves out what a library costs per call (oneDNN's about 11 us, MKL's about 2) and how it
shares the cores with the rest of an update, so ``--update-rounds N`` also times the whole update,
eager and compiled, with ``SB3_AMAGO_CPU_MATMUL=onednn`` and ``=blas`` in alternating fresh processes
(``compare_commits.measure``), N rounds each: the medians and the median of the per-round ratios.

    python benchmarks/cpu_matmul.py --threads 2
    python benchmarks/cpu_matmul.py --threads 2 --update-rounds 6 --name cpu_matmul_updates
    python benchmarks/cpu_matmul.py --threads 1 --length 256 --name cpu_matmul_L256_1thread

Results: ``benchmarks/results/cpu_matmul.json`` / ``.md`` (``--name`` changes the file name).
"""

import argparse
import os
import statistics
from typing import Any

import torch as th
from bench_updates import MatrixOpRecorder, best_seconds, module_settings, replay_seconds, trained_model
from common import write_results
from compare_commits import measure_rounds
from torch.nn import functional as F

from sb3_amago.nets import cpu_matmul

Call = tuple[Any, tuple, dict]  # a recorded product: operator, argument specs, keyword specs


def recorded_products(length: int) -> list[Call]:
    """Every routed product (``sb3_amago::onednn_linear``) of one fp32 update at window ``length``."""
    with module_settings(cpu_matmul, ONEDNN=True):
        model = trained_model(length, mixed_precision=False)
        recorder = MatrixOpRecorder()
        with recorder:
            model.train(gradient_steps=1, batch_size=8)
    op = th.ops.sb3_amago.onednn_linear.default
    return [call for call in recorder.calls if call[0] is op]


def replay(products: list[Call], repeats: int) -> dict[str, float]:
    """Seconds ``products`` take with each library (``bench_updates.replay_seconds``: each product
    alone on fresh operands of the recorded shapes and strides, its best of ``repeats`` after a
    warm-up call)."""
    return {
        "onednn": replay_seconds(products, repeats),
        "blas": replay_seconds([(F.linear, args, kwargs) for _, args, kwargs in products], repeats),
    }


def flops(products: list[Call]) -> float:
    return float(sum(2 * th.Size(args[0].shape).numel() * args[1].shape[0] for _, args, _ in products))


def whole_updates(threads: int, length: int, rounds: int, compile_model: bool) -> dict[str, dict[str, Any]]:
    """Updates/s of the working tree's reference update with each library forced, ``rounds`` rounds of
    one fresh process per library, the order alternating from round to round."""
    mode = "compiled" if compile_model else "eager"
    settings = {
        library: {"extra_env": {cpu_matmul.ENV_VARIABLE: library}, "compile_model": compile_model}
        for library in ("onednn", "blas")
    }
    result = measure_rounds(settings, threads, length, 20, rounds, alternate=True, label=f"{mode} ")
    figures = {
        f"update_{mode}_{library}": {
            "value": result.median(library),
            "unit": f"updates/s (L = {length}, median of {rounds} fresh processes)",
            "runs": [round(rate, 3) for rate in result.runs[library]],
        }
        for library in settings
    }
    ratios = result.ratios("onednn", "blas")
    figures[f"onednn_speedup_update_{mode}"] = {
        "value": statistics.median(ratios),
        "unit": "x (median of per-round oneDNN / BLAS updates/s)",
        "rounds_above_1": sum(ratio > 1 for ratio in ratios),
        "load_average_range": result.load_range,
    }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--length", type=int, default=64, help="window length L of the reference update")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--update-rounds", type=int, default=0, help="also time whole updates, eager and compiled, with each library"
    )
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
    for compile_model in (False, True) if args.update_rounds else ():
        figures.update(whole_updates(args.threads, args.length, args.update_rounds, compile_model))
    for name, figure in figures.items():
        print(f"{name}: {figure}")
    choice = "onednn" if cpu_matmul.onednn_matmul_chosen() else "blas"
    print(f"{cpu_matmul.ENV_VARIABLE} ({os.environ.get(cpu_matmul.ENV_VARIABLE, 'auto')}) picks {choice} here")
    config = {
        "threads": args.threads,
        "length": args.length,
        "repeats": args.repeats,
        "update_rounds": args.update_rounds,
        "gflop_per_update": update_flops / 1e9,
        "choice_here": f"{os.environ.get(cpu_matmul.ENV_VARIABLE, 'auto')} -> {choice}",
    }
    write_results(args.name, config, figures)


if __name__ == "__main__":
    main()
