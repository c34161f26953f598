"""File watching: watchdog events, coalesced per path and delivered after a quiet period.

Editors save through temporary files and renames, and builds touch many files at once, so an
event only marks its path dirty; a path is handed on once no event arrived for it during the
debounce interval. Events on directories and on ignore files ask for a rescan instead, which the
stat cache makes cheap.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from indexer.ignore import ALWAYS_SKIPPED_DIRS, IGNORE_FILES
from indexer.secrets import is_denied

log = logging.getLogger(__name__)


class Debouncer:
    """Collects paths and calls `deliver(paths)` with those quiet for `delay` seconds."""

    def __init__(self, delay: float, deliver: Callable[[list[str]], None]) -> None:
        self.delay = delay
        self.deliver = deliver
        self._due: dict[str, float] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="tabloop-debounce", daemon=True)
        self._thread.start()

    def touch(self, path: str) -> None:
        with self._cond:
            self._due[path] = time.monotonic() + self.delay
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    now = time.monotonic()
                    ready = [p for p, due in self._due.items() if due <= now]
                    if ready:
                        for path in ready:
                            del self._due[path]
                        break
                    wait = min(self._due.values(), default=now + 1.0) - now
                    self._cond.wait(max(wait, 0.005))
                if self._closed:
                    return
            try:
                self.deliver(ready)
            except Exception:
                log.warning("delivering file events failed", exc_info=True)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=5)


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: WorkspaceWatcher) -> None:
        self.watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in ("opened", "closed_no_write"):
            return
        for raw in (event.src_path, getattr(event, "dest_path", "")):
            if raw:
                path = os.fsdecode(raw)
                # A directory's own "modified" event only echoes changes to its files.
                if not (event.is_directory and event.event_type == "modified"):
                    self.watcher.observe(path, event.is_directory)


class WorkspaceWatcher:
    """Watches a workspace; files go to `on_files`, directory-level changes to `on_rescan`."""

    def __init__(
        self,
        root: Path,
        delay: float,
        on_files: Callable[[list[str]], None],
        on_rescan: Callable[[], None],
    ) -> None:
        self.root = root
        self.on_rescan = on_rescan
        self.debouncer = Debouncer(delay, on_files)
        self._observer = Observer()
        self._observer.daemon = True
        self._observer.schedule(_Handler(self), str(root), recursive=True)

    def start(self) -> None:
        self._observer.start()

    def observe(self, path: str, is_directory: bool) -> None:
        """Route one event path."""
        try:
            rel = Path(path).relative_to(self.root).as_posix()
        except ValueError:
            return
        parts = rel.split("/")
        if any(part in ALWAYS_SKIPPED_DIRS for part in parts):
            return
        if is_directory or parts[-1] in IGNORE_FILES:
            self.on_rescan()
        elif not is_denied(rel):
            # A secret is not even queued; the indexer applies the scan's full rules (links,
            # ignore files, content) to whatever is.
            self.debouncer.touch(rel)

    def close(self) -> None:
        self._observer.stop()
        self.debouncer.close()
        self._observer.join(timeout=5)
