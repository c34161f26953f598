"""What clients sent, per tenant and minute, and what their spools hold: counted in memory,
written to the database every few seconds.

Each ingest request adds to an in-memory counter (microseconds, no I/O); `flush()` writes the
counters as one additive upsert per (tenant, minute) into `ingest_minutes` and the newest
report of each installation into `client_spools`. An extra transaction per request would cost an
fsync each on SQLite: more than the request itself. Counters of several workers or replicas add
up in the database. A process killed between flushes loses at most `interval_s` of these counts
(never an event).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite

from backend.db.models import ClientSpool, IngestMinute
from backend.storage import Storage

log = logging.getLogger(__name__)

COUNTERS = (
    "batches",
    "events",
    "accepted",
    "duplicate",
    "rejected_events",
    "refused_batches",
    "duplicate_batches",
    "rate_limited",
)


@dataclass
class SpoolReport:
    """An installation's spool as its sender reported it with a batch."""

    backlog: int
    dropped: int
    at: datetime


@dataclass
class _Pending:
    minutes: dict[tuple[int, int], dict[str, int]] = field(default_factory=dict)
    spools: dict[tuple[int, str], SpoolReport] = field(default_factory=dict)


class IngestRecorder:
    """Counts batches per tenant and minute; a background thread writes them down."""

    def __init__(
        self,
        storage: Storage,
        *,
        interval_s: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.storage = storage
        self.interval_s = interval_s
        self._clock = clock
        self._pending = _Pending()
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def count(self, tenant_id: int, **counts: int) -> None:
        """Add `counts` (names of `COUNTERS`) to the tenant's current minute."""
        minute = int(self._clock()) // 60 * 60
        with self._lock:
            row = self._pending.minutes.setdefault((tenant_id, minute), dict.fromkeys(COUNTERS, 0))
            for name, value in counts.items():
                row[name] += value

    def spool(self, tenant_id: int, install_id: str, backlog: int, dropped: int) -> None:
        """Keep the newest spool report of an installation."""
        with self._lock:
            self._pending.spools[(tenant_id, install_id)] = SpoolReport(
                backlog, dropped, datetime.fromtimestamp(self._clock(), UTC)
            )

    def flush(self) -> None:
        """Write what was counted since the last flush (kept for the next one on failure)."""
        with self._flush_lock:
            with self._lock:
                pending, self._pending = self._pending, _Pending()
            if not pending.minutes and not pending.spools:
                return
            try:
                self._write(pending)
            except Exception:
                log.warning("ingest statistics not written; kept for the next flush", exc_info=True)
                with self._lock:
                    self._merge_back(pending)

    def _merge_back(self, pending: _Pending) -> None:
        for key, row in pending.minutes.items():
            current = self._pending.minutes.setdefault(key, dict.fromkeys(COUNTERS, 0))
            for name, value in row.items():
                current[name] += value
        for spool_key, report in pending.spools.items():
            self._pending.spools.setdefault(spool_key, report)

    def _write(self, pending: _Pending) -> None:
        make: Any = postgresql.insert if self.storage.dialect == "postgresql" else sqlite.insert
        minutes = cast(Table, IngestMinute.__table__)
        spools = cast(Table, ClientSpool.__table__)
        with self.storage.engine.begin() as connection:
            for (tenant_id, minute), row in sorted(pending.minutes.items()):
                statement = make(minutes).values(tenant_id=tenant_id, minute=minute, **row)
                connection.execute(
                    statement.on_conflict_do_update(
                        index_elements=["tenant_id", "minute"],
                        set_={name: minutes.c[name] + statement.excluded[name] for name in row},
                    )
                )
            for (tenant_id, install_id), report in sorted(pending.spools.items()):
                statement = make(spools).values(
                    tenant_id=tenant_id,
                    install_id=install_id,
                    backlog=report.backlog,
                    dropped=report.dropped,
                    reported_at=report.at,
                )
                connection.execute(
                    statement.on_conflict_do_update(
                        index_elements=["tenant_id", "install_id"],
                        set_={
                            "backlog": statement.excluded.backlog,
                            "dropped": statement.excluded.dropped,
                            "reported_at": statement.excluded.reported_at,
                        },
                    )
                )

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Flush every `interval_s` in a background thread."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="tabloop-ingest-stats", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.flush()

    def stop(self) -> None:
        """Stop the thread and write what is left."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval_s + 5.0)
            self._thread = None
        self.flush()
