"""Group commit: concurrent ingest requests share one transaction and one fsync.

A durable commit costs an fsync (milliseconds on ordinary disks), far more than inserting a
hundred rows. The first request to arrive becomes the leader: it commits its own rows and those
of every request that queued up meanwhile in one transaction, and hands each its result; then it
leads again while more are waiting. With a single client this is one request per commit and no
thread hand-off; under load each fsync carries many requests' events.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from sqlalchemy import Connection, Engine

log = logging.getLogger(__name__)

Rows = Any  # what `write` takes: a sequence of rows, or one batch in a form of its own
Pending = tuple[Rows, Future[set[str]]]
Write = Callable[[Connection, Any], set[str]]


class GroupCommitter:
    """Runs `write` (inserts rows, returns the new keys) for many callers per transaction."""

    def __init__(self, engine: Engine, write: Write) -> None:
        self.engine = engine
        self.write = write
        self.commits = 0
        self._lock = threading.Lock()
        self._pending: list[Pending] = []
        self._leading = False

    def insert(self, rows: Rows, timeout: float = 60.0) -> set[str]:
        """Insert `rows` durably; returns the keys that were new. Raises what the database did."""
        done: Future[set[str]] = Future()
        with self._lock:
            self._pending.append((rows, done))
            lead = not self._leading
            self._leading = True
        if lead:
            self._lead()
        return done.result(timeout)

    def _lead(self) -> None:
        while True:
            with self._lock:
                group, self._pending = self._pending, []
                if not group:
                    self._leading = False
                    return
            self._commit(group)

    def _commit(self, group: list[Pending]) -> None:
        try:
            results = []
            with self.engine.begin() as connection:
                for rows, _ in group:
                    results.append(self.write(connection, rows))
            self.commits += 1
        except Exception as exc:  # every caller of this transaction learns it failed
            log.warning("group commit of %d batches failed: %s", len(group), exc)
            for _, done in group:
                done.set_exception(exc)
            return
        for (_, done), inserted in zip(group, results, strict=True):
            done.set_result(inserted)
