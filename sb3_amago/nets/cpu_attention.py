"""Causal attention on the CPU in fp32 with the package's own kernel (``cpu_attention.cpp``).

torch's CPU attention kernels are slow at this model's head width (16): the flash kernel runs its
per-block products on small BLAS calls (on an AMD EPYC, MKL's generic code path), and the math
backend writes and reads the whole ``(L, L)`` scores several times. The kernel here takes each
(batch, head) pair as one task across the threads and, within it, blocks of 32 queries whose
scores against every key they may see are computed whole (an exact softmax), vectorised along the
keys; the backward recomputes them from the saved log-sum-exp. It reads its inputs at their strides
and turns queries and keys by the rotary tables as it reads them, so the Transformer hands it the
views of its projection and no rotation or copy runs outside it. Two threads of a Zen 4 EPYC, forward
and backward at ``(8, 8, L, 16)``: 0.56 against 1.39 ms (torch's math backend, compiled) at 65
steps, 4.4 against 11.6 ms (torch's flash kernel) at 257 (``benchmarks/cpu_attention.py``;
``docs/design.md``, "CPU attention").

It is C++ built with ``torch.utils.cpp_extension`` the first time a process needs it on a machine
(about 30 s; later processes load the build from torch's extension cache), for the vector
instructions torch itself runs (AVX-512 or AVX2). ``SB3_AMAGO_CPU_ATTENTION`` chooses, once per
process: ``auto`` (the default) builds it where torch runs AVX2 or AVX-512 code and falls back to
torch's kernels with a warning if the build fails; ``native`` requires it (an error if it cannot be
built); ``torch`` never builds it. :func:`load` builds or loads it; a CPU model with a Transformer calls
it when built (:class:`~sb3_amago.AMAGO`), before anything is compiled.
"""

import os
import re
import shutil
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import torch as th
from torch.utils.flop_counter import register_flop_formula, sdpa_flop_count

#: Environment variable that chooses CPU attention's kernel: auto, native or torch.
ENV_VARIABLE = "SB3_AMAGO_CPU_ATTENTION"
CHOICES = ("auto", "native", "torch")
#: The kernel's source, built by :func:`load`.
SOURCE = Path(__file__).with_name("cpu_attention.cpp")
#: Compiler flags for each CPU capability torch reports (``torch.backends.cpu.get_cpu_capability``):
#: the instructions and the ``at::vec`` implementation that torch's own kernels use there.
ISA_FLAGS = {
    "AVX512": [
        "-mavx512f",
        "-mavx512dq",
        "-mavx512vl",
        "-mavx512bw",
        "-mfma",
        "-DCPU_CAPABILITY_AVX512",
        "-DCPU_CAPABILITY=AVX512",
    ],
    "AVX2": ["-mavx2", "-mfma", "-DCPU_CAPABILITY_AVX2", "-DCPU_CAPABILITY=AVX2"],
}


def _choice() -> str:
    choice = os.environ.get(ENV_VARIABLE, "auto")
    if choice not in CHOICES:
        raise ValueError(f"{ENV_VARIABLE}={choice!r} is not one of {CHOICES}: unset it or set one of those.")
    return choice


#: This process's choice (:data:`ENV_VARIABLE`), read at import.
CHOICE = _choice()
_kernels: ModuleType | None = None
_tried = False


#: The start of every build's name (and of its library's file name).
BUILD_PREFIX = "sb3_amago_cpu_attention"


def build_name(capability: str) -> str:
    """The extension's name for a CPU capability: one build per capability and torch version, since
    a build is compiled against one torch's headers and for one instruction set."""
    return re.sub(r"\W", "_", f"{BUILD_PREFIX}_{capability.lower()}_torch_{th.__version__}")


def load() -> bool:
    """Build or load the kernel, once per process (a no-op after the first call); whether it is loaded.

    Not built under ``SB3_AMAGO_CPU_ATTENTION=torch`` or where torch runs neither AVX2 nor AVX-512
    code (other architectures). A failed build warns and leaves torch's kernels in use under
    ``auto``, and raises under ``native``."""
    global _kernels, _tried
    if _tried or CHOICE == "torch":
        return loaded()
    _tried = True
    capability = th.backends.cpu.get_cpu_capability()
    flags = ISA_FLAGS.get(capability)
    if flags is None:
        if CHOICE == "native":
            raise RuntimeError(
                f"{ENV_VARIABLE}=native, but sb3_amago's CPU attention kernel is built for AVX2 or AVX-512 only "
                f"and torch runs {capability!r} code here: set {ENV_VARIABLE}=auto or torch."
            )
        return False
    from torch.utils import cpp_extension  # imported here: it is slow to import and only the build needs it

    _put_ninja_on_path()
    try:
        _kernels = cpp_extension.load(
            name=build_name(capability),
            sources=[str(SOURCE)],
            extra_cflags=["-O3", "-fopenmp", *flags],
            extra_ldflags=["-fopenmp"],
        )
    except Exception as error:  # a missing compiler or ninja, a failed compile or link
        if CHOICE == "native":
            raise RuntimeError(
                f"{ENV_VARIABLE}=native, but sb3_amago's CPU attention kernel could not be built ({error}). It needs "
                f"a C++ compiler and ninja (pip install ninja); set {ENV_VARIABLE}=torch to use torch's kernels."
            ) from error
        warnings.warn(
            f"sb3_amago's CPU attention kernel could not be built ({error}), so training on the CPU uses torch's "
            f"attention kernels, which are 2-3x slower at this model's head width. It needs a C++ compiler and "
            f"ninja (pip install ninja); {ENV_VARIABLE}=torch uses torch's kernels without trying.",
            stacklevel=2,
        )
    return loaded()


def _put_ninja_on_path() -> None:
    """torch builds with the ``ninja`` it finds on ``PATH``; the one ``pip`` installed with the package
    may lie outside it (a virtual environment used without activating it), so its folder is added."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja
    except ImportError:
        return
    os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])


def loaded() -> bool:
    """Whether the kernel is in use: :func:`load` has loaded it and :data:`CHOICE` is not ``torch``
    (benchmarks set it so for a while to time torch's kernels)."""
    return CHOICE != "torch" and _kernels is not None


def _kernel_module() -> ModuleType:
    if _kernels is None:
        raise RuntimeError("sb3_amago's CPU attention kernel is not loaded: call sb3_amago.nets.cpu_attention.load() first.")
    return _kernels


@th.library.custom_op("sb3_amago::causal_attention", mutates_args=())
def causal_attention_with_lse(
    q: th.Tensor, k: th.Tensor, v: th.Tensor, cos: th.Tensor, sin: th.Tensor
) -> tuple[th.Tensor, th.Tensor]:
    """Causal softmax attention of fp32 CPU tensors ``(..., L, Dh)`` each (any strides), scaled by
    ``1 / sqrt(Dh)``, the queries and keys first turned by the rotary tables ``cos`` and ``sin``
    (:func:`~sb3_amago.nets.rotary.rotary_tables`, broadcastable to the queries' shape; both empty:
    no rotation): the output ``(..., L, Dh)`` and each query's log-sum-exp of its scaled scores
    ``(..., L)``.

    Empty tables rather than ``None``: compiled (torch 2.13), inductor's Python wrapper leaves a
    ``None`` argument out of the call, and its C++ wrapper passes the dispatcher fewer values than
    the schema has where a defaulted one is left out, which crashes the process."""
    out, lse = _kernel_module().forward(q, k, v, cos, sin)
    return out, lse


@causal_attention_with_lse.register_fake
def _(q: th.Tensor, k: th.Tensor, v: th.Tensor, cos: th.Tensor, sin: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1])


@th.library.custom_op("sb3_amago::causal_attention_backward", mutates_args=())
def causal_attention_backward(
    grad: th.Tensor, q: th.Tensor, k: th.Tensor, v: th.Tensor, cos: th.Tensor, sin: th.Tensor, out: th.Tensor, lse: th.Tensor
) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
    """The gradients of :func:`causal_attention_with_lse`'s output with respect to ``q``, ``k`` and ``v``
    as given (before their rotation)."""
    dq, dk, dv = _kernel_module().backward(grad, q, k, v, cos, sin, out, lse)
    return dq, dk, dv


@causal_attention_backward.register_fake
def _(
    grad: th.Tensor, q: th.Tensor, k: th.Tensor, v: th.Tensor, cos: th.Tensor, sin: th.Tensor, out: th.Tensor, lse: th.Tensor
) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
    return q.new_empty(q.shape), q.new_empty(q.shape), q.new_empty(q.shape)


def _setup_context(ctx: Any, inputs: tuple[th.Tensor, ...], output: tuple[th.Tensor, th.Tensor]) -> None:
    ctx.save_for_backward(*inputs, *output)


def _backward(ctx: Any, grad: th.Tensor, grad_lse: th.Tensor | None) -> tuple[th.Tensor, th.Tensor, th.Tensor, None, None]:
    # The log-sum-exp is saved for the backward, not trained through: its gradient is never used;
    # the rotary tables are functions of time indices, with no gradient either.
    return (*causal_attention_backward(grad, *ctx.saved_tensors), None, None)


causal_attention_with_lse.register_autograd(_backward, setup_context=_setup_context)


def causal_attention(q: th.Tensor, k: th.Tensor, v: th.Tensor, rotary: tuple[th.Tensor, th.Tensor] | None = None) -> th.Tensor:
    """Causal softmax attention with the kernel (loaded by :func:`load`): ``(..., L, Dh)`` each ->
    ``(..., L, Dh)``, queries and keys turned by the ``rotary`` tables ``(cos, sin)`` where given."""
    cos, sin = (q.new_empty(0), q.new_empty(0)) if rotary is None else rotary
    return causal_attention_with_lse(q, k, v, cos, sin)[0]


def attention_flops(q_shape: th.Size, k_shape: th.Size, v_shape: th.Size, *args: Any, **kwargs: Any) -> int:
    """FLOPs of a causal attention forward as torch counts attention: the scores and their product
    with the values, the ``(L, L)`` products whole. For this kernel's operator, and for torch's CPU
    flash kernel, which ``FlopCounterMode`` lacks (``benchmarks/bench_updates.py``)."""
    return sdpa_flop_count(q_shape, k_shape, v_shape)


def attention_backward_flops(
    grad_shape: th.Size, q_shape: th.Size, k_shape: th.Size, v_shape: th.Size, *args: Any, **kwargs: Any
) -> int:
    """The backward's four products of the gradients, as torch counts them (the scores computed
    again are not counted)."""
    return 2 * sdpa_flop_count(q_shape, k_shape, v_shape)


register_flop_formula(th.ops.sb3_amago.causal_attention)(attention_flops)
register_flop_formula(th.ops.sb3_amago.causal_attention_backward)(attention_backward_flops)
