"""SIGTERM during ``AMAGO.learn`` unwinds the run as Ctrl-C does, so that a script can save before it exits."""

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


class TrainingInterrupted(KeyboardInterrupt):
    """SIGTERM arrived during ``AMAGO.learn`` (a job scheduler stopping the run, ``kill``): raised in
    its place so the run unwinds as on Ctrl-C and the script can save before it exits."""


@contextlib.contextmanager
def sigterm_raises_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`TrainingInterrupted` in the main thread, unless the
    process already handles SIGTERM itself (its handler is then left alone); restored afterwards."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def interrupt(signum: int, _frame: Any) -> None:
        raise TrainingInterrupted(f"Signal {signal.Signals(signum).name} received during learn.")

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
