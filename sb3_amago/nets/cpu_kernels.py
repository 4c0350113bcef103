"""The package's C++ kernels for the CPU: building them, loading them, and the setting that chooses them.

Two fp32 kernels, in one build: causal attention (``cpu_attention.cpp``, used through
:mod:`sb3_amago.nets.cpu_attention`) and dropout's keep mask (``cpu_dropout.cpp``, used by
:mod:`sb3_amago.nets.dropout`). They are compiled with ``torch.utils.cpp_extension`` the first time
a process needs them on a machine (about 30 s; later processes load the build from torch's extension
cache), for the vector instructions torch itself runs (AVX-512 or AVX2). ``SB3_AMAGO_CPU_KERNELS``
chooses, once per process: ``auto`` (the default) builds them where torch runs AVX2 or AVX-512 code
and falls back to torch's operators with a warning if the build fails; ``native`` requires them (an
error if they cannot be built); ``torch`` never builds them. :func:`load` builds or loads them; a CPU
model with a Transformer calls it (:class:`~sb3_amago.AMAGO`), before anything is compiled.

The build also holds the cache of freed blocks that :func:`sb3_amago.cpu_memory.keep_freed_memory`
puts in front of torch's CPU allocator (``cpu_block_cache.cpp``), the clipped AdamW step that
:func:`sb3_amago.clipped_step.clipped_step` runs for the default optimizer (``cpu_adamw.cpp``), and C++ kernels for the package's
operators on the CPU (``sb3_amago::leaky_relu``, ``linear_leaky_relu``, ``dropout_key``,
``dropout_keep_mask``, ``causal_attention``, ``causal_attention_backward``, ``stack_projection``,
``rotary_tables`` and ``layer_norm_backward``), which :func:`load` registers over their
Python kernels: a compiled update calls them from inductor's C++ wrapper without entering Python
(1.02x the compiled update at L = 64 on an Intel Xeon, the same values). It registers the autograd of
the operators that run only with the build in C++ too (``cpu_kernels.cpp``). Without the build the
Python kernels run, with the same values.
"""

import hashlib
import os
import re
import shutil
import warnings
from pathlib import Path
from types import ModuleType

import torch as th

#: Environment variable that chooses the CPU kernels: auto, native or torch.
ENV_VARIABLE = "SB3_AMAGO_CPU_KERNELS"
#: Its name before the dropout mask joined the attention kernel; set, it is an error that names the new one.
OLD_ENV_VARIABLE = "SB3_AMAGO_CPU_ATTENTION"
CHOICES = ("auto", "native", "torch")
#: The sources of the build: the two kernels, the freed-block cache, the AdamW step and their Python module.
SOURCES = [
    Path(__file__).with_name(name)
    for name in ("cpu_attention.cpp", "cpu_dropout.cpp", "cpu_block_cache.cpp", "cpu_adamw.cpp", "cpu_kernels.cpp")
]
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
    if OLD_ENV_VARIABLE in os.environ:
        raise ValueError(
            f"{OLD_ENV_VARIABLE} is now {ENV_VARIABLE} (it chooses the dropout mask's kernel too): set that instead."
        )
    choice = os.environ.get(ENV_VARIABLE, "auto")
    if choice not in CHOICES:
        raise ValueError(f"{ENV_VARIABLE}={choice!r} is not one of {CHOICES}: unset it or set one of those.")
    return choice


#: This process's choice (:data:`ENV_VARIABLE`), read at import.
CHOICE = _choice()
_kernels: ModuleType | None = None
_tried = False


#: The start of every build's name (and of its library's file name).
BUILD_PREFIX = "sb3_amago_cpu_kernels"


def sources_digest(sources: list[Path] = SOURCES) -> str:
    """A short hash of the sources' text and where they lie: two versions of the package, or two
    checkouts of one, never share a build (a build's ninja file names its sources' paths, so two
    checkouts under one name rebuilt it in every process that alternated between them, as a
    benchmark of two commits does)."""
    digest = hashlib.sha256()
    for source in sources:
        digest.update(str(source.resolve()).encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()[:12]


def build_name(capability: str, sources: list[Path] = SOURCES) -> str:
    """The build's name for a CPU capability: one build per capability, torch version and version of
    the sources, since a build is compiled against one torch's headers, for one instruction set, from
    one text. (Under one name, processes of two versions, such as a benchmark's two sides, would
    rebuild it in turn, and a process could load the other version's build.)"""
    return re.sub(r"\W", "_", f"{BUILD_PREFIX}_{capability.lower()}_torch_{th.__version__}_{sources_digest(sources)}")


def build(sources: list[Path], capability: str) -> ModuleType:
    """Build (or load from torch's extension cache) the kernels of ``sources`` for a CPU capability
    of :data:`ISA_FLAGS`: the package's (:data:`SOURCES`), or another version's for a benchmark."""
    from torch.utils import cpp_extension  # imported here: it is slow to import and only the build needs it

    _put_ninja_on_path()
    return cpp_extension.load(
        name=build_name(capability, sources),
        sources=[str(source) for source in sources],
        extra_cflags=["-O3", "-fopenmp", *ISA_FLAGS[capability]],
        extra_ldflags=["-fopenmp"],
    )


def load() -> bool:
    """Build or load the kernels, once per process (a no-op after the first call); whether they are loaded.

    Not built under ``SB3_AMAGO_CPU_KERNELS=torch`` or where torch runs neither AVX2 nor AVX-512
    code (other architectures). A failed build warns and leaves torch's operators in use under
    ``auto``, and raises under ``native``."""
    global _kernels, _tried
    if _tried or CHOICE == "torch":
        return loaded()
    _tried = True
    capability = th.backends.cpu.get_cpu_capability()
    if not buildable():
        if CHOICE == "native":
            raise RuntimeError(
                f"{ENV_VARIABLE}=native, but sb3_amago's CPU kernels are built for AVX2 or AVX-512 only "
                f"and torch runs {capability!r} code here: set {ENV_VARIABLE}=auto or torch."
            )
        return False
    try:
        built = build(SOURCES, capability)
        built.register_operators()
        _kernels = built
    except Exception as error:  # a missing compiler or ninja, a failed compile or link
        if CHOICE == "native":
            raise RuntimeError(
                f"{ENV_VARIABLE}=native, but sb3_amago's CPU kernels could not be built ({error}). They need "
                f"a C++ compiler and ninja (pip install ninja); set {ENV_VARIABLE}=torch to use torch's operators."
            ) from error
        warnings.warn(
            f"sb3_amago's CPU kernels could not be built ({error}), so training on the CPU uses torch's "
            f"attention kernels, which are 2-3x slower at this model's head width, and a slower dropout mask. "
            f"They need a C++ compiler and ninja (pip install ninja); {ENV_VARIABLE}=torch uses torch's operators "
            "without trying.",
            stacklevel=2,
        )
    return loaded()


def buildable() -> bool:
    """Whether :func:`load` builds the kernels in this process (the build may still fail):
    :data:`CHOICE` is not ``torch`` and torch runs AVX2 or AVX-512 code here."""
    return CHOICE != "torch" and th.backends.cpu.get_cpu_capability() in ISA_FLAGS


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
    """Whether the kernels are in use: :func:`load` has loaded them and :data:`CHOICE` is not ``torch``
    (benchmarks set it so for a while to time torch's operators)."""
    return CHOICE != "torch" and _kernels is not None


def kernels() -> ModuleType:
    """The loaded build's Python module (``attention_forward``, ``attention_backward``, ``dropout_keep_mask``,
    ``register_operators``, ``clipped_adamw_step``, and the freed-block cache's ``cache_freed_blocks``, ``release_freed_blocks``
    and ``freed_block_stats``)."""
    if _kernels is None:
        raise RuntimeError("sb3_amago's CPU kernels are not loaded: call sb3_amago.nets.cpu_kernels.load() first.")
    return _kernels
