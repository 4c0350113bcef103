"""The clipped optimizer step inside the reference update: the package's C++ step against torch's.

On the CPU the default AdamW's clipped step runs as one C++ call (``sb3_amago/nets/cpu_adamw.cpp``,
the same values bit for bit as torch's fused step). Its gain, under a millisecond of a ~35 ms update,
is below what alternating fresh processes resolves on a VM, so it is timed here inside one process:
the reference model (``bench_updates.trained_model``) runs its own updates (sample, forward, backward,
PopArt), and around each the clip and step are timed, the EMA of the targets after them; the step
alternates between the C++ call and torch's (``clip_grad_norm_``'s norms, then ``optimizer.step()``)
every 10 updates, each side first in turn. Reported: the median time of each piece per side and
each side's mean update time.

    python benchmarks/optimizer_step.py --threads 2                 # eager (the defaults)
    python benchmarks/optimizer_step.py --threads 2 --compile       # the compiled update

Results: ``benchmarks/results/optimizer_step[_compiled].json`` / ``.md`` (``--name`` changes it).
"""

import argparse
import statistics
import time

import torch as th
from bench_updates import trained_model
from common import RESULTS_DIR, write_results

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
    policy, optimizer = model.policy, model.policy.optimizer
    params = policy.online_parameters()
    native_lists = clipped_step_module.native_step_lists
    policy.set_training_mode(True)

    def update(side: str) -> tuple[float, float]:
        """One update of the reference model; the seconds of its clip and step, and of its EMA."""
        clipped_step_module.native_step_lists = native_lists if side == "native" else (lambda *a: None)
        batch = model.replay_buffer.sample(8, env=None)
        loss, _, popart = model._update_forward(policy, batch, model.loss_config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if popart is not None:
            policy.popart.load(popart)
        start = time.perf_counter()
        clipped_step_module.clipped_step(optimizer, params, model.max_grad_norm)
        stepped = time.perf_counter()
        policy.update_targets(model.tau)
        return stepped - start, time.perf_counter() - stepped

    step_s: dict[str, list[float]] = {side: [] for side in SIDES}
    ema_s: dict[str, list[float]] = {side: [] for side in SIDES}
    update_s: dict[str, list[float]] = {side: [] for side in SIDES}
    try:
        for _ in range(10):  # warm-up of both sides
            for side in SIDES:
                update(side)
        for r in range(args.rounds):
            for side in SIDES if r % 2 else SIDES[::-1]:
                start = time.perf_counter()
                for _ in range(10):
                    step, ema = update(side)
                    step_s[side].append(step)
                    ema_s[side].append(ema)
                update_s[side].append((time.perf_counter() - start) / 10)
    finally:
        clipped_step_module.native_step_lists = native_lists
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
