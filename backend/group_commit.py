"""Group commit: concurrent ingest requests share one transaction and one fsync.

A durable commit costs an fsync (milliseconds on ordinary disks), far more than inserting a
hundred rows. Requests hand their rows to one writer thread; it runs every batch that is waiting
in a single transaction, commits once, and hands each request the ids its own rows inserted.
Under load the number of commits per second stays at what the disk allows while each commit
carries more events; with a single client it is one request per commit, as before.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from sqlalchemy import Engine, Executable

log = logging.getLogger(__name__)

MAX_ROWS_PER_COMMIT = 5000


class GroupCommitter:
    """Runs `statement` (an insert returning the new keys) for many callers per transaction."""

    def __init__(self, engine: Engine, statement: Executable) -> None:
        self.engine = engine
        self.statement = statement
        self.commits = 0
        self._queue: queue.SimpleQueue[tuple[Sequence[dict[str, Any]], Future[set[str]]] | None]
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="tabloop-group-commit", daemon=True)
        self._thread.start()

    def insert(self, rows: Sequence[dict[str, Any]], timeout: float = 60.0) -> set[str]:
        """Insert `rows` durably; returns the keys that were new. Raises what the database did."""
        done: Future[set[str]] = Future()
        self._queue.put((rows, done))
        return done.result(timeout)

    def close(self) -> None:
        """Finish what is queued and stop the writer thread."""
        self._queue.put(None)
        self._thread.join(30)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            group = [first]
            rows = len(first[0])
            stop = False
            while rows < MAX_ROWS_PER_COMMIT:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                group.append(item)
                rows += len(item[0])
            self._commit(group)
            if stop:
                return

    def _commit(self, group: list[tuple[Sequence[dict[str, Any]], Future[set[str]]]]) -> None:
        try:
            results = []
            with self.engine.begin() as connection:
                for rows, _ in group:
                    results.append(set(connection.execute(self.statement, rows).scalars()))
            self.commits += 1
        except Exception as exc:  # every caller of this transaction learns it failed
            log.warning("group commit of %d batches failed: %s", len(group), exc)
            for _, done in group:
                done.set_exception(exc)
            return
        for (_, done), inserted in zip(group, results, strict=True):
            done.set_result(inserted)
