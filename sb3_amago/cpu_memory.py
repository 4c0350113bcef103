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
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
#: The heap's free top is returned to the kernel only beyond this.
TRIM_THRESHOLD = 2**30


@functools.cache
def keep_freed_memory() -> bool:
    """Serve every block from the heap (no ``mmap`` of its own, whatever its size) and raise glibc's
    trim threshold, for this process (once); ``True`` where both were set,
    ``False`` where the C library is not glibc or ``SB3_AMAGO_KEEP_FREED_MEMORY=0`` says not to."""
    if os.environ.get(ENV_VARIABLE, "1") == "0":
        return False
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
