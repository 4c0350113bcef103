"""Keep freed memory in the process on glibc, so that an update's large temporaries reuse pages
instead of faulting fresh ones in (``docs/design.md``, "CPU memory").

Process-wide and applied once, by the first AMAGO built on the CPU; ``SB3_AMAGO_KEEP_FREED_MEMORY=0``
in the environment leaves glibc's settings alone. Elsewhere (macOS, Windows, musl) nothing is done.
"""

import ctypes
import ctypes.util
import functools
import os

#: Environment variable that turns the setting off ("0").
ENV_VARIABLE = "SB3_AMAGO_KEEP_FREED_MEMORY"
#: mallopt parameter numbers (malloc.h).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: Blocks below this come from the heap: glibc's largest allowed value on 64-bit (32 MiB).
MMAP_THRESHOLD = 32 * 2**20
#: The heap's free top is returned to the kernel only beyond this.
TRIM_THRESHOLD = 2**30


@functools.cache
def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (once); ``True`` where they were set,
    ``False`` where the C library is not glibc or ``SB3_AMAGO_KEEP_FREED_MEMORY=0`` says not to."""
    if os.environ.get(ENV_VARIABLE, "1") == "0":
        return False
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


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
