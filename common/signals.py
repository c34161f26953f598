"""SIGTERM handled as an exit: `finally` blocks, context managers and exit hooks run.

Python's default for SIGTERM ends the process at once, so what a long command started (a training
child in a process group of its own, a temporary directory) outlives it. Inside
`sigterm_as_exit()` the signal raises `SystemExit(143)` in the main thread instead, as Ctrl-C
raises `KeyboardInterrupt`.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


def _exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """Within the block, SIGTERM raises SystemExit (main thread only; elsewhere a no-op);
    the previous handler is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
