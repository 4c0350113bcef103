"""How ``compile_model=True`` compiles the update's forward: ``torch.compile`` with inductor, its options
chosen for the model's device, and on the CPU a decomposition table of the package's own
(:func:`inductor_decompositions`): the layer norm's backward as torch's own kernel
(:mod:`sb3_amago.nets.layer_norm`), and the rectifiers' operators as their twins without autograd
(:mod:`sb3_amago.nets.activations`).

The forward (:func:`sb3_amago.loss.update_forward`: the sequence model, the TD target, PopArt's move
and the loss) is one graph, compiled with a dynamic time axis: training batches of another length
reuse it (:func:`compile_update`).
"""

import functools
from collections.abc import Callable, Collection
from typing import Any

import torch as th

from sb3_amago.nets import activations, layer_norm
from sb3_amago.type_aliases import TrajectoryBatch


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


#: The entries the package puts in inductor's decomposition table: each replaces inductor's own, or adds one.
PACKAGE_DECOMPOSITIONS: dict[Any, Callable[..., Any]] = {**layer_norm.DECOMPOSITIONS, **activations.RUN_TIME_OPERATORS}


def _entry_name(target: Any) -> str:
    return str(target) if isinstance(target, th._ops.OpOverload) else f"{target.__module__}.{target.__qualname__}"


def package_entry_names(without: Collection[str] = ()) -> tuple[str, ...]:
    """The entries of :data:`PACKAGE_DECOMPOSITIONS` by name (``"op -> replacement"``), but those of the
    operators named in ``without`` (``"sb3_amago.leaky_relu.default"``): what a pickled table carries
    into inductor's cache keys."""
    return tuple(sorted(f"{op} -> {_entry_name(fn)}" for op, fn in PACKAGE_DECOMPOSITIONS.items() if str(op) not in without))


class DecompositionTable(dict[Any, Callable[..., Any]]):
    """A decomposition table that pickles as the call of :func:`inductor_decompositions` that makes it,
    with the package's entries in it by name (``entries``). inductor pickles a table given to
    ``compile_fx`` into its caches' keys, and some entries of its own table are C++ functions that
    cannot be pickled: pickled whole, every compile would bypass the caches and redo inductor's work in
    each process. The rest of what the table holds follows from torch's version and inductor's
    configuration, which the keys hold already; the names keep a graph compiled under other package
    entries apart."""

    def __init__(self, table: dict[Any, Callable[..., Any]], entries: tuple[str, ...]) -> None:
        super().__init__(table)
        self.entries = entries

    def __reduce__(self) -> tuple[Callable[[tuple[str, ...]], "DecompositionTable"], tuple[tuple[str, ...]]]:
        return _unpickled_table, (self.entries,)


def inductor_decompositions(without: Collection[str] = ()) -> DecompositionTable:
    """inductor's decomposition table (``select_decomp_table``, under the inductor configuration in
    force) with :data:`PACKAGE_DECOMPOSITIONS` in it, but the entries of the operators named in
    ``without`` (a measurement's other side: ``benchmarks/table_entries.py``)."""
    from torch._inductor.decomposition import select_decomp_table  # imported only when compiling

    table = DecompositionTable(select_decomp_table(), package_entry_names(without))
    table.update({op: fn for op, fn in PACKAGE_DECOMPOSITIONS.items() if str(op) not in without})
    return table


def _unpickled_table(entries: tuple[str, ...]) -> DecompositionTable:
    """The table a pickled one stands for: the package's entries of those names in it."""
    in_table = {name.split(" -> ")[0] for name in entries}
    return inductor_decompositions(without=[str(op) for op in PACKAGE_DECOMPOSITIONS if str(op) not in in_table])


class CpuInductor:
    """inductor as a ``torch.compile`` backend, with ``options`` and the decomposition table of
    :func:`inductor_decompositions` (read under those options, which choose inductor's table; the
    package's entries but those of the operators named in ``without``). One instance per set of options
    (:func:`cpu_backend`), so that models compiled alike share dynamo's compiled code."""

    compiler_name = "inductor"  # for dynamo's debugging tools, which treat inductor apart

    def __init__(self, options: dict[str, Any], without: Collection[str] = ()) -> None:
        self.options = dict(options)
        self.without = tuple(without)

    def __call__(self, graph: th.fx.GraphModule, example_inputs: list[Any]) -> Any:
        import torch._inductor.config as inductor_config
        from torch._inductor.compile_fx import compile_fx

        with inductor_config.patch(self.options):
            decompositions = inductor_decompositions(self.without)
        return compile_fx(graph, example_inputs, config_patches=self.options, decompositions=decompositions)


@functools.cache
def cpu_backend(options: tuple[tuple[str, Any], ...]) -> CpuInductor:
    """The :class:`CpuInductor` of ``options`` (its items, sorted), made once per process."""
    return CpuInductor(dict(options))


def compile_update(fn: Callable[..., Any], device: th.device) -> Callable[..., Any]:
    """``fn(policy, batch, cfg)`` compiled for ``device``: with :class:`CpuInductor` on the CPU (the layer
    norm's backward as torch's kernel: about 1% of the compiled update on an Intel Xeon, 1.013x at L = 64
    and 1.012x at L = 256, both ways alternated in one process, ``benchmarks/layer_norm_backward.py``),
    with inductor and :func:`inductor_options` elsewhere.

    On the CPU only the batch's time axis is dynamic (:func:`time_axis_dynamic`): windows are as long as
    the longest in the batch, so one graph serves every length, while the batch size and the feature
    widths, fixed in a run, are compiled in (a batch of another size compiles once more). With
    inductor's code for known sizes, and fewer shape guards, the compiled update ran 1.006x and 1.012x
    faster than with every size dynamic at L = 64 on an Intel Xeon (two runs of 30 rounds alternated in
    one process, ``benchmarks/dynamic_axes.py``; 1.003x at L = 256), with the same values. Elsewhere
    every size is dynamic."""
    options = inductor_options(device)
    if device.type != "cpu":
        return th.compile(fn, dynamic=True, options=options)
    return cpu_compiled(fn, cpu_backend(tuple(sorted(options.items()))))


def cpu_compiled(fn: Callable[..., Any], backend: Callable[[th.fx.GraphModule, list[Any]], Any]) -> Callable[..., Any]:
    """``fn(policy, batch, cfg)`` compiled with ``backend``, the batch's time axis dynamic and every other
    size compiled in (:func:`compile_update`)."""
    compiled = th.compile(fn, backend=backend)

    def update(policy: Any, batch: TrajectoryBatch, cfg: Any) -> Any:
        time_axis_dynamic(batch)
        return compiled(policy, batch, cfg)

    return update


def time_axis_dynamic(batch: TrajectoryBatch) -> None:
    """Mark the time axis (dim 1) of every tensor of ``batch`` dynamic for ``torch.compile``: the graph
    compiled for it takes any window length (unless its code needs a length's value)."""
    for field in batch:
        for tensor in field.values() if isinstance(field, dict) else (field,):
            th._dynamo.maybe_mark_dynamic(tensor, 1)
