"""Giving memory back to the system between two large phases of one process.

A model's tensors often live in reference cycles (peft's wrappers, accelerate's hooks), so they
outlast the last name bound to them until the cycle collector runs; and glibc keeps freed heap
pages for the process. A process that trains and then merges and converts an adapter would
hold the first phase's gigabytes through the second (measured on the bundled model: 4.6 GB
resident after training, 0.5 GB after `release_memory`), which the training loop's memory cap
counts.

And an inference engine maps its weights file and reads parts of it once, to pack them into its
own layout; those pages stay resident, counted in the process's memory, though nothing reads
them again (`release_mapped_file`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

MADV_PAGEOUT = 21  # Linux 5.4: reclaim these pages now, their contents kept

PRIMITIVE_CACHE_ENV = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"
TRAINING_PRIMITIVE_CACHE = 64
"""oneDNN primitives a training process keeps (oneDNN's default: 1024). torch's CPU matrix
products in bfloat16 are oneDNN primitives, one per shape, and every example's length is a new
shape: on the bundled model without activation checkpointing, 64 examples peaked at 4.6 GB with
the default and at 3.9 GB with 64 (4.0 GB with 128), at the same samples/s; with no cache at all
a step took 4x as long (`docs/learning.md`)."""


def release_memory() -> None:
    """Collect reference cycles, then hand freed heap pages back to the system (glibc's
    `malloc_trim`; elsewhere only the collection)."""
    gc.collect()
    trim_heap()


def trim_heap() -> None:
    """Hand the heap's free pages back to the system (glibc's `malloc_trim`; elsewhere
    nothing): a burst of large buffers, once freed, stays resident without it."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def can_release_pages() -> bool:
    """Whether `release_mapped_file` can work here: Linux 5.4 or later (`MADV_PAGEOUT`)."""
    if not sys.platform.startswith("linux"):
        return False
    numbers = re.findall(r"\d+", os.uname().release)[:2]
    return len(numbers) == 2 and (int(numbers[0]), int(numbers[1])) >= (5, 4)


def mapped_resident_kb(path: Path) -> int:
    """How many kB of this process's mappings of file `path` are resident (0 off Linux)."""
    target, total, inside = os.fspath(path.resolve()), 0, False
    try:
        with open("/proc/self/smaps", encoding="utf-8", errors="replace") as smaps:
            for line in smaps:
                fields = line.split(maxsplit=5)
                if fields and "-" in fields[0] and not fields[0].endswith(":"):  # a mapping
                    inside = len(fields) == 6 and fields[5].rstrip("\n") == target
                elif inside and fields[0] == "Rss:":
                    total += int(fields[1])
    except OSError:
        return 0
    return total


def release_mapped_file(path: Path) -> int:
    """Give back the resident pages of this process's mappings of file `path`; the bytes of
    mappings advised (0 where `can_release_pages` is false, or the file is not mapped).

    ONNX Runtime maps a model's external weights file and packs most tensors into buffers of its
    own at load, reading each once (the bundled model's matrix scales: about 60 MB that then stay
    resident, unread). `madvise(MADV_PAGEOUT)` reclaims such pages with their contents kept: a
    page read again later comes back from the file (or from swap, had it been written), so what
    is still in use returns to the process on its next read and nothing else does.
    """
    if not can_release_pages():
        return 0
    target = os.fspath(path.resolve())
    ranges: list[tuple[int, int]] = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].rstrip("\n") == target:
                    start, end = (int(bound, 16) for bound in fields[0].split("-"))
                    ranges.append((start, end))
    except OSError:
        return 0
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    except OSError:
        return 0
    advise = libc.madvise
    advise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    released = 0
    for start, end in ranges:
        if advise(start, end - start, MADV_PAGEOUT) == 0:
            released += end - start
    return released


class IdleTrim:
    """`trim_heap` once work has paused for `delay_s`.

    An engine's request allocates large buffers (a chunk's scores alone are 15 MB for the bundled
    model) that the heap keeps once they are freed: about 40 MB more after a few completions
    (docs/models.md). A trim takes a few milliseconds, so it waits for a pause in the work (the
    user reading a suggestion) rather than lengthen a request.
    """

    def __init__(self, delay_s: float = 1.0, trim: Callable[[], None] = trim_heap) -> None:
        self.delay_s = delay_s
        self._trim = trim
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._active = 0  # pieces of work under way

    @property
    def pending(self) -> bool:
        """Whether a trim waits for the pause to last."""
        with self._lock:
            return self._timer is not None

    def _fire(self, timer: threading.Timer) -> None:
        with self._lock:
            if self._timer is not timer:
                return  # work began again in the meantime
            self._timer = None
        self._trim()

    @contextlib.contextmanager
    def working(self) -> Iterator[None]:
        """Around a piece of work: no trim during it, one after it once the pause lasts."""
        with self._lock:
            self._active += 1
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    timer = threading.Timer(self.delay_s, lambda: self._fire(timer))
                    timer.daemon = True
                    self._timer = timer
                    timer.start()


def bound_primitive_cache(capacity: int = TRAINING_PRIMITIVE_CACHE) -> int | None:
    """Ask oneDNN to keep at most `capacity` primitives in this process, unless the environment
    already says how many; the capacity in effect, or None where it cannot be told.

    oneDNN reads the variable when its cache is first used, so this works in a process that has
    not yet run a oneDNN operation (a training process before its first step); later it changes
    nothing."""
    os.environ.setdefault(PRIMITIVE_CACHE_ENV, str(capacity))
    try:
        return int(os.environ[PRIMITIVE_CACHE_ENV])
    except ValueError:
        return None
