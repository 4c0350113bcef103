"""The package's CPU attention kernel against torch's, alone and inside whole compiled updates.

Alone: causal attention forward and backward at the reference model's sizes (batch 8, 8 heads of
width 16) for each window of ``--lengths`` steps, on the package's kernel
(``sb3_amago.nets.cpu_attention``), torch's math backend compiled (``causal_math_attention`` under
``torch.compile``, as a compiled update ran it up to ``CPU_MATH_ATTENTION_MAX_STEPS`` steps) and
torch's flash kernel (``scaled_dot_product_attention``), each from a projection of queries, keys and
values ``(8, L + 1, 3, 8, 16)`` and back to its gradient, as in the Transformer; each the best of
``--repeats``.

Inside updates (``--update-rounds N``): two compiled reference updates (``bench_updates.py``) in this
process, one traced and run with the package's CPU kernels set aside (``cpu_kernels.CHOICE = "torch"``:
the dropout mask's kernel too, which the update's figure then includes) and one with them, timed alternately for N rounds of ``--updates`` updates, the order swapped every round:
the median of the per-round ratios and the rounds in which the kernel's update was faster. One
process, because this VM's speed moves between processes by more than the change.

Against another revision (``--base REV``): that revision's kernels, built from its sources in a git
worktree, and the working tree's, each called directly on the same projection with rotary tables at
each of ``--base-lengths``, forward and backward timed apart (a best of ``--base-repeats`` per side
and round), alternating for ``--base-rounds`` rounds in this process: the medians, their ratios, and
whether the two give the same values bit for bit.

    python benchmarks/cpu_attention.py --threads 2 --update-rounds 10
    python benchmarks/cpu_attention.py --threads 2 --lengths --base HEAD~1 --base-lengths 256 1024 4096

Results: ``benchmarks/results/cpu_attention.json`` / ``.md`` (``--name`` changes the file name).
"""

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch as th
from bench_updates import alternated_update_seconds, best_seconds, module_settings, trained_model
from common import git_worktree, short_commit, write_results
from torch.nn import functional as F

from sb3_amago.nets import cpu_attention, cpu_kernels
from sb3_amago.nets.rotary import rotary_tables
from sb3_amago.nets.transformer import causal_math_attention, split_heads

#: Attention over a projection (B, L, 3, H, Dh) of queries, keys and values, as the Transformer computes it.
Attention = Callable[[th.Tensor], th.Tensor]


def torch_flash(qkv: th.Tensor) -> th.Tensor:
    q, k, v = split_heads(qkv).unbind(0)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def torch_math(qkv: th.Tensor) -> th.Tensor:
    return causal_math_attention(*split_heads(qkv).unbind(0))


def forward_backward_ms(attention: Attention, steps: int, repeats: int) -> float:
    """Best milliseconds of one forward and backward pass at ``(8, 8, steps, 16)``, from and back to
    a projection ``(8, steps, 3, 8, 16)`` as in the Transformer."""
    gen = th.Generator().manual_seed(steps)
    qkv = th.randn(8, steps, 3, 8, 16, generator=gen).requires_grad_()
    grad = th.randn(8, 8, steps, 16, generator=gen)

    def step() -> None:
        attention(qkv).backward(grad)

    return 1e3 * best_seconds(step, repeats)  # after an untimed call (compilation)


def kernel_figures(lengths: list[int], repeats: int) -> dict[str, dict[str, Any]]:
    sides: dict[str, Attention] = {
        "package": cpu_attention.projection_attention,
        "torch_math_compiled": th.compile(torch_math, dynamic=True),
        "torch_flash": torch_flash,
    }
    figures = {}
    for length in lengths:
        ms = {name: forward_backward_ms(fn, length + 1, repeats) for name, fn in sides.items()}
        figures[f"attention_L{length}"] = {
            "value": round(ms["package"], 3),
            "unit": "ms, forward and backward at (8, 8, L + 1, 16), best of repeats",
            "steps": length + 1,
            "torch_math_compiled_ms": round(ms["torch_math_compiled"], 3),
            "torch_flash_ms": round(ms["torch_flash"], 3),
            "speedup_vs_best_of_torch": round(min(ms["torch_math_compiled"], ms["torch_flash"]) / ms["package"], 2),
        }
    return figures


def update_figure(length: int, rounds: int, updates: int) -> dict[str, Any]:
    """The compiled reference update with torch's attention over the one with the package's kernel."""
    with module_settings(cpu_kernels, CHOICE="torch"):
        torchs = trained_model(length, compile_model=True)
    package = trained_model(length, compile_model=True)
    choices = {"torch": "torch", "package": cpu_kernels.CHOICE}
    times = alternated_update_seconds(
        {"torch": torchs, "package": package}, rounds, updates, lambda name: module_settings(cpu_kernels, CHOICE=choices[name])
    )
    ratios = [t / p for t, p in zip(times["torch"], times["package"])]
    return {
        "value": round(statistics.median(ratios), 4),
        "unit": "x (compiled update with torch's attention over the package's kernel, median of per-round ratios)",
        "rounds_package_faster": f"{sum(r > 1 for r in ratios)}/{rounds}",
        "torch_median_ms": round(1e3 * statistics.median(times["torch"]), 2),
        "package_median_ms": round(1e3 * statistics.median(times["package"]), 2),
        "ratios": [round(r, 4) for r in ratios],
    }


def kernel_pass_seconds(
    kernels: Any, qkv: th.Tensor, tables: tuple[th.Tensor, th.Tensor], grad: th.Tensor, repeats: int
) -> tuple[float, float, list[th.Tensor]]:
    """The best forward and the best backward seconds of a build's kernels (``attention_forward`` and
    ``attention_backward`` of :mod:`sb3_amago.nets.cpu_kernels`' module) over ``repeats`` calls of
    each, and their results (output, log-sum-exp, the projection's gradient)."""
    forward, backward = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        out, lse = kernels.attention_forward(qkv, *tables)
        forward.append(time.perf_counter() - start)
        start = time.perf_counter()
        dqkv = kernels.attention_backward(grad, qkv, *tables, out, lse)
        backward.append(time.perf_counter() - start)
    return min(forward), min(backward), [out, lse, dqkv]


def base_figures(base: str, lengths: list[int], rounds: int, repeats: int) -> dict[str, dict[str, Any]]:
    """The working tree's kernel against revision ``base``'s, alternating in this process."""
    capability = th.backends.cpu.get_cpu_capability()
    with git_worktree(base) as tree:
        builds = {"base": cpu_kernels.build([tree / "sb3_amago" / "nets" / s.name for s in cpu_kernels.SOURCES], capability)}
    builds["working_tree"] = cpu_kernels.kernels()
    figures = {}
    for length in lengths:
        steps = length + 1
        gen = th.Generator().manual_seed(steps)
        qkv = th.randn(8, steps, 3, 8, 16, generator=gen)
        grad = th.randn(8, steps, 8, 16, generator=gen).transpose(1, 2)  # the output projection's layout
        tables = rotary_tables(th.arange(steps).repeat(8, 1), 16)
        times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in builds}
        results = {}
        for round_ in range(rounds):
            for name in list(builds) if round_ % 2 == 0 else list(builds)[::-1]:
                forward, backward, results[name] = kernel_pass_seconds(builds[name], qkv, tables, grad, repeats)
                times[name][0].append(forward)
                times[name][1].append(backward)
        ms = {name: [1e3 * statistics.median(t) for t in pair] for name, pair in times.items()}
        figures[f"against_base_L{length}"] = {
            "value": round((ms["base"][0] + ms["base"][1]) / (ms["working_tree"][0] + ms["working_tree"][1]), 3),
            "unit": f"x (base {short_commit(base)} over the working tree, forward + backward, medians of {rounds} rounds)",
            "steps": steps,
            "forward_ms": {name: round(pair[0], 3) for name, pair in ms.items()},
            "backward_ms": {name: round(pair[1], 3) for name, pair in ms.items()},
            "forward_speedup": round(ms["base"][0] / ms["working_tree"][0], 3),
            "backward_speedup": round(ms["base"][1] / ms["working_tree"][1], 3),
            "same_values": all(th.equal(a, b) for a, b in zip(results["base"], results["working_tree"])),
        }
        print(f"L={length}: {figures[f'against_base_L{length}']}", flush=True)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lengths", type=int, nargs="*", default=[64, 128, 256, 512], help="windows L (L + 1 steps)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--update-rounds", type=int, default=0, help="rounds of whole compiled updates (0: none)")
    parser.add_argument("--update-lengths", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--updates", type=int, default=10, help="updates per round and side")
    parser.add_argument("--base", help="a revision whose kernels to time against the working tree's")
    parser.add_argument("--base-lengths", type=int, nargs="+", default=[64, 256, 1024, 4096])
    parser.add_argument("--base-rounds", type=int, default=5)
    parser.add_argument("--base-repeats", type=int, default=3, help="calls per side and round (the best is kept)")
    parser.add_argument("--name", default="cpu_attention")
    args = parser.parse_args()
    th.set_num_threads(args.threads)
    if not cpu_kernels.load():
        raise SystemExit("the package's CPU attention kernel is not built on this machine (see the warning above)")
    figures = kernel_figures(args.lengths, args.repeats)
    if args.base:
        figures.update(base_figures(args.base, args.base_lengths, args.base_rounds, args.base_repeats))
    for length in args.update_lengths if args.update_rounds else []:
        figures[f"update_L{length}"] = update_figure(length, args.update_rounds, args.updates)
    write_results(args.name, vars(args), figures)


if __name__ == "__main__":
    main()
