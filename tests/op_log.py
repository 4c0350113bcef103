"""A record of the operators that reach the dispatcher, for tests that check which kernels a call runs."""

from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class OpLog(TorchDispatchMode):
    """Inside ``with OpLog() as log:``, every operator call as ``(name, args)`` in ``log.calls``,
    e.g. ``("aten.mm.default", (a, b))``; ``log.names`` lists the names alone."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple]] = []

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.calls.append((str(func), args))
        return func(*args, **(kwargs or {}))
