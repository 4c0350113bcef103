"""How ``compile_model=True`` compiles the update's forward: ``torch.compile`` with inductor, its options
chosen for the model's device, and on the CPU a decomposition table that keeps the layer norm's
backward as torch's own kernel (:mod:`sb3_amago.nets.layer_norm`).

The forward (:func:`sb3_amago.loss.update_forward`: the sequence model, the TD target, PopArt's move
and the loss) is one graph, compiled with dynamic shapes: training batches of another length reuse it.
"""

import functools
from collections.abc import Callable
from typing import Any

import torch as th

from sb3_amago.nets import layer_norm


def inductor_options(device: th.device) -> dict[str, Any]:
    """inductor's options for the compiled update on ``device``. On the CPU, the C++ wrapper launches
    the compiled kernels without Python between them (~1 ms of a 33 ms update at L = 64, for ~10% more
    compile time), and a layer norm's mean and variance come from one Welford pass over each row where
    inductor takes two for rows of up to 1,024 (the mean, then the squares about it): 1.02x the compiled
    update at L = 64 and 256 on an Intel Xeon, both ways alternated in one process. On CUDA, inductor's
    tiling analysis for coalesced loads fails an assertion on this dynamic-shape graph (torch 2.11), so
    it is off there. Random draws come from torch's generator as in eager code (``fallback_random``), so
    a seed gives the eager update's draws."""
    import torch._inductor.config as inductor_config  # 0.8 s to import: only when compiling

    options: dict[str, Any] = {"fallback_random": True, "cpp_wrapper": device.type == "cpu"}
    if device.type == "cpu" and hasattr(inductor_config.cpp, "use_two_step_variance_threshold"):
        options["cpp.use_two_step_variance_threshold"] = 0
    if device.type == "cuda":
        options["triton.coalesce_tiling_analysis"] = False
    return options


class CpuInductor:
    """inductor as a ``torch.compile`` backend, with ``options`` and the decomposition table of
    :func:`~sb3_amago.nets.layer_norm.inductor_decompositions` (read under those options, which choose
    inductor's table). One instance per set of options (:func:`cpu_backend`), so that models compiled
    alike share dynamo's compiled code."""

    compiler_name = "inductor"  # for dynamo's debugging tools, which treat inductor apart

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = dict(options)

    def __call__(self, graph: th.fx.GraphModule, example_inputs: list[Any]) -> Any:
        import torch._inductor.config as inductor_config
        from torch._inductor.compile_fx import compile_fx

        with inductor_config.patch(self.options):
            decompositions = layer_norm.inductor_decompositions()
        return compile_fx(graph, example_inputs, config_patches=self.options, decompositions=decompositions)


@functools.cache
def cpu_backend(options: tuple[tuple[str, Any], ...]) -> CpuInductor:
    """The :class:`CpuInductor` of ``options`` (its items, sorted), made once per process."""
    return CpuInductor(dict(options))


def compile_update(fn: Callable[..., Any], device: th.device) -> Callable[..., Any]:
    """``fn`` compiled for ``device``: with :class:`CpuInductor` on the CPU (the layer norm's backward
    as torch's kernel: about 1% of the compiled update on an Intel Xeon, 1.013x at L = 64 and 1.012x at
    L = 256, both ways alternated in one process, ``benchmarks/layer_norm_backward.py``), with inductor
    and :func:`inductor_options` elsewhere."""
    options = inductor_options(device)
    if device.type == "cpu":
        return th.compile(fn, dynamic=True, backend=cpu_backend(tuple(sorted(options.items()))))
    return th.compile(fn, dynamic=True, options=options)
