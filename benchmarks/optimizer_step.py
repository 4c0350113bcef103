"""The clipped optimizer step inside the reference update: the package's C++ step against torch's.

On the CPU the default AdamW's clipped step runs as one C++ call (``sb3_amago/nets/cpu_adamw.cpp``,
the same values bit for bit as torch's fused step). Its gain, under a millisecond of a ~35 ms update,
is below what alternating fresh processes resolves on a VM, so it is timed here inside one process:
the reference model (``bench_updates.trained_model``) trains in rounds of 10 updates (``train``), its
clipped step and the EMA of its targets timed around each call; the step alternates between the C++
call and torch's (``clip_grad_norm_``'s norms, then ``optimizer.step()``) from round to round, each
side first in turn. Reported: the median time of each piece per side and each side's mean update time.

    python benchmarks/optimizer_step.py --threads 2                 # eager (the defaults)
    python benchmarks/optimizer_step.py --threads 2 --compile       # the compiled update

Results: ``benchmarks/results/optimizer_step[_compiled].json`` / ``.md`` (``--name`` changes it).
"""

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch as th
from bench_updates import trained_model
from common import RESULTS_DIR, write_results

from sb3_amago import amago as amago_module
from sb3_amago import clipped_step as clipped_step_module
from sb3_amago.nets import cpu_kernels

SIDES = ("torch", "native")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=30, help="alternations of 10 updates per side")
    parser.add_argument("--compile", action="store_true", help="the compiled update (compile_model=True)")
    parser.add_argument("--name", default=None)
    args = parser.parse_args()
    th.set_num_threads(args.threads)
    model = trained_model(args.length, compile_model=args.compile)
    if not cpu_kernels.loaded():
        raise SystemExit("the package's CPU kernels are not loaded here: there is no C++ step to time")
    native_lists = clipped_step_module.native_step_lists
    step_s: dict[str, list[float]] = {side: [] for side in SIDES}
    ema_s: dict[str, list[float]] = {side: [] for side in SIDES}
    update_s: dict[str, list[float]] = {side: [] for side in SIDES}
    timed: dict[str, list[float]] = {}  # the running round's side's lists, by piece

    def timing(fn: Callable[..., Any], piece: str) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            start = time.perf_counter()
            out = fn(*args)
            timed[piece].append(time.perf_counter() - start)
            return out

        return run

    kept_step = amago_module.clipped_step
    amago_module.clipped_step = timing(kept_step, "step")
    model.policy.update_targets = timing(model.policy.update_targets, "ema")  # type: ignore[method-assign]

    def round_of_10(side: str) -> float:
        """Ten updates through ``train`` with ``side``'s step; their seconds."""
        clipped_step_module.native_step_lists = native_lists if side == "native" else (lambda *a: None)
        timed["step"], timed["ema"] = step_s[side], ema_s[side]
        start = time.perf_counter()
        model.train(gradient_steps=10, batch_size=8)
        return time.perf_counter() - start

    try:
        for side in SIDES:  # warm-up of both sides
            round_of_10(side)
        for side in SIDES:
            step_s[side].clear()
            ema_s[side].clear()
        for r in range(args.rounds):
            for side in SIDES if r % 2 else SIDES[::-1]:
                update_s[side].append(round_of_10(side) / 10)
    finally:
        clipped_step_module.native_step_lists = native_lists
        amago_module.clipped_step = kept_step
        del model.policy.update_targets
    figures = {}
    for side in SIDES:
        figures[f"clip_and_step_ms_{side}"] = {"value": 1e3 * statistics.median(step_s[side]), "unit": "ms (median)"}
        figures[f"ema_ms_{side}"] = {"value": 1e3 * statistics.median(ema_s[side]), "unit": "ms (median)"}
        figures[f"update_ms_{side}"] = {"value": 1e3 * statistics.mean(update_s[side]), "unit": "ms (mean)"}
    figures["update_speedup"] = {
        "value": statistics.mean(update_s["torch"]) / statistics.mean(update_s["native"]),
        "unit": "x (torch's mean update time over the native one's)",
        "rounds_faster": sum(n < t for n, t in zip(update_s["native"], update_s["torch"], strict=True)),
        "rounds": args.rounds,
    }
    for key, figure in figures.items():
        print(f"{key}: {figure['value']:.4g} {figure['unit']}")
    config = {"length": args.length, "rounds": args.rounds, "updates_per_round": 10, "compile_model": args.compile}
    name = args.name or ("optimizer_step_compiled" if args.compile else "optimizer_step")
    write_results(name, config, figures, out_dir=RESULTS_DIR)


if __name__ == "__main__":
    main()
