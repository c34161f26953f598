"""Crash-safe files and the single-writer lock.

Every file the index writes goes through `atomic_write`: the bytes go to a temporary file in the
same directory, are fsync'ed, replace the target with `os.replace` (atomic on POSIX), and the
directory is fsync'ed so the rename itself survives a crash. A reader therefore sees the old file
or the new one, never a mix. Temporary files left by a killed writer end in `.tmp` and are
removed by `remove_stale_temps`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from pathlib import Path

TEMP_SUFFIX = ".tmp"
CORRUPT_SUFFIX = ".corrupt"


def fsync_dir(directory: Path) -> None:
    """Make a rename or unlink in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new content."""
    temp = path.with_name(f"{path.name}.{os.getpid()}{TEMP_SUFFIX}")
    try:
        with open(temp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    fsync_dir(path.parent)


def remove_stale_temps(directory: Path) -> int:
    """Delete temporary files a killed writer left behind; the number removed."""
    removed = 0
    for temp in directory.glob(f"*{TEMP_SUFFIX}"):
        with contextlib.suppress(OSError):
            temp.unlink()
            removed += 1
    return removed


def quarantine(path: Path) -> Path | None:
    """Move a corrupt file aside as `<name>.corrupt` (keeping it for inspection)."""
    target = path.with_name(path.name + CORRUPT_SUFFIX)
    moved = None
    for suffix in ("", "-wal", "-shm", "-journal"):
        source = path.with_name(path.name + suffix)
        if source.exists():
            with contextlib.suppress(OSError):
                os.replace(source, target.with_name(target.name + suffix))
                moved = target
    if moved is not None:
        with contextlib.suppress(OSError):
            fsync_dir(path.parent)
    return moved


class WriterLock:
    """An exclusive `flock` on a lock file: one writer per index across processes.

    The kernel drops the lock when the holder dies, so a killed writer never blocks the next.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, timeout: float = 0.0) -> bool:
        """Take the lock, waiting up to `timeout` seconds; False when another process holds it."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.05)
                continue
            self._fd = fd
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return True

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
