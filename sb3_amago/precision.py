"""Whether bf16 autocast (``mixed_precision``) pays on this machine's CPU.

torch multiplies bf16 matrices natively only with AVX-512 BF16 or AMX instructions; elsewhere its
bf16 products are converted in software, and the reference update under autocast runs several
times slower than in fp32 (``benchmarks/bf16_isa.py`` measures it by holding oneDNN to smaller
instruction sets on a CPU that has them).
"""

import functools
import warnings

import torch as th

#: torch's checks of the CPU's bf16 matrix instructions (private, so looked up by name).
_CHECKS = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")


@functools.cache
def cpu_has_native_bf16() -> bool | None:
    """Whether the CPU has AVX-512 BF16 or AMX; ``None`` where this torch cannot tell."""
    checks = [check for name in _CHECKS if callable(check := getattr(th.cpu, name, None))]
    if len(checks) < len(_CHECKS):
        return None
    return any(check() for check in checks)


def warn_if_bf16_is_emulated(device: th.device) -> None:
    """Warn where ``mixed_precision`` would train on a CPU without bf16 matrix instructions."""
    if device.type == "cpu" and cpu_has_native_bf16() is False:
        warnings.warn(
            "mixed_precision=True on a CPU without bf16 matrix instructions (neither AVX-512 BF16 nor AMX): "
            "torch converts bf16 products in software there, and an update runs several times slower than in "
            "fp32 (benchmarks/bf16_isa.py). Set mixed_precision=False.",
            stacklevel=3,
        )
