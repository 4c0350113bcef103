"""Keep freed memory in the process on the CPU, so that an update's temporaries reuse blocks instead of
faulting fresh pages in or searching the C library's heap for them (``docs/design.md``, "CPU memory").

Two settings, both process-wide, applied by each AMAGO built on the CPU (each takes effect once):

- glibc serves every block from its heap (no ``mmap`` of its own, whatever its size) and returns the
  heap's free top to the kernel only beyond 1 GiB (elsewhere, on macOS, Windows or musl, nothing is
  done);
- where the package's CPU kernels are loaded (:mod:`sb3_amago.nets.cpu_kernels`; a CPU model with a
  Transformer loads them), a cache of freed blocks sits in front of torch's CPU allocator
  (``nets/cpu_block_cache.cpp``): a freed block of 4 KiB or more waits on a list of its exact size for
  the next request of that size, up to :data:`BLOCK_CACHE_CAP` bytes held. It is not installed where
  another allocator has replaced torch's default one. :func:`release_freed_blocks` hands its blocks
  back.

``SB3_AMAGO_KEEP_FREED_MEMORY=0`` in the environment leaves both alone.
"""

import ctypes
import ctypes.util
import functools
import os
from typing import NamedTuple

from sb3_amago.nets import cpu_kernels

#: Environment variable that turns the settings off ("0").
ENV_VARIABLE = "SB3_AMAGO_KEEP_FREED_MEMORY"
#: mallopt parameter numbers (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
#: The heap's free top is returned to the kernel only beyond this.
TRIM_THRESHOLD = 2**30
#: The most bytes the freed-block cache holds; a block that would take it beyond empties it first.
BLOCK_CACHE_CAP = 2**30


class FreedMemory(NamedTuple):
    """Which of the settings are in effect in this process."""

    glibc_heap: bool
    block_cache: bool


def keep_freed_memory() -> FreedMemory:
    """Apply the settings this process can take (see the module's docstring) and say which are in effect."""
    if os.environ.get(ENV_VARIABLE, "1") == "0":
        return FreedMemory(glibc_heap=False, block_cache=False)
    block_cache = cpu_kernels.loaded() and bool(cpu_kernels.kernels().cache_freed_blocks(BLOCK_CACHE_CAP))
    return FreedMemory(glibc_heap=_keep_in_glibc_heap(), block_cache=block_cache)


def release_freed_blocks() -> None:
    """Hand the blocks the freed-block cache holds back to the C library (where the cache is loaded)."""
    if cpu_kernels.loaded():
        cpu_kernels.kernels().release_freed_blocks()


@functools.cache
def _keep_in_glibc_heap() -> bool:
    """glibc's ``mmap`` of large blocks off and its trim threshold raised, once; whether both were set."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def _glibc() -> ctypes.CDLL | None:
    """The process's C library where it is glibc (it has ``gnu_get_libc_version``), else ``None``."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None
