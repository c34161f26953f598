"""The on-disk spool: events wait here, in SQLite, until the backend has them.

Durability: the database runs in WAL mode with `synchronous=FULL`, so every committed
transaction is fsynced to the WAL before `commit()` returns; a committed event survives kill -9
and power loss. (`NORMAL` would survive kill -9 but could lose the last transactions on power
loss.) The cost, one fsync per commit, is paid by the writer thread, which commits whole batches;
callers never wait on it.

Bounds: at most `max_events` events and `max_bytes` bytes. When a new batch would exceed either,
the oldest events are dropped and the persistent `dropped_events` counter grows by exactly the
number dropped, in the same transaction.

A spool that SQLite cannot read is moved aside (`spool.sqlite3.corrupt-<time>`) and a new one is
started, so a damaged file costs its own contents and nothing after.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

QUARANTINE_MAX_EVENTS = 10_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL UNIQUE,
    body BLOB NOT NULL,
    bytes INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS quarantine (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL,
    body BLOB NOT NULL,
    status INTEGER,
    reason TEXT NOT NULL,
    at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO counters VALUES
    ('events', 0), ('bytes', 0), ('dropped_events', 0), ('quarantined_events', 0),
    ('quarantine_dropped', 0);
-- Triggers keep the totals exact whatever path inserts or deletes.
CREATE TRIGGER IF NOT EXISTS events_in AFTER INSERT ON events BEGIN
    UPDATE counters SET value = value + 1 WHERE name = 'events';
    UPDATE counters SET value = value + NEW.bytes WHERE name = 'bytes';
END;
CREATE TRIGGER IF NOT EXISTS events_out AFTER DELETE ON events BEGIN
    UPDATE counters SET value = value - 1 WHERE name = 'events';
    UPDATE counters SET value = value - OLD.bytes WHERE name = 'bytes';
END;
"""


@dataclass(frozen=True)
class SpooledEvent:
    """One event as stored: its id and its JSON body."""

    seq: int
    event_id: str
    body: bytes


@dataclass(frozen=True)
class SpoolStats:
    """Counts of the spool, all persistent."""

    events: int
    bytes: int
    dropped_events: int
    quarantined_events: int
    quarantine_rows: int


class SpoolCorrupt(Exception):
    """The spool file is not a readable SQLite database."""


class Spool:
    """A bounded, durable FIFO of serialized events, safe to share between threads."""

    def __init__(
        self,
        path: Path,
        *,
        max_events: int = 100_000,
        max_bytes: int = 64 * 1024 * 1024,
        busy_timeout_s: float = 10.0,
    ) -> None:
        self.path = Path(path)
        self.busy_timeout_s = busy_timeout_s
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.moved_aside: list[Path] = []
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = self._open_or_replace()

    # -- opening and recovery -------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout_s,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout_s * 1000)}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")
            row = conn.execute("PRAGMA quick_check").fetchone()
            if row is None or row[0] != "ok":
                raise SpoolCorrupt(f"quick_check: {row[0] if row else 'no answer'}")
            conn.executescript(_SCHEMA)
        except (sqlite3.DatabaseError, SpoolCorrupt):
            conn.close()
            raise
        return conn

    def _open_or_replace(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.OperationalError:
            raise  # locked or unwritable: not corruption, do not destroy anything
        except (sqlite3.DatabaseError, SpoolCorrupt) as exc:
            self._move_aside(exc)
            return self._connect()

    def _move_aside(self, exc: BaseException) -> None:
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{os.getpid()}")
        log.warning("telemetry spool %s is unreadable (%s); moved to %s", self.path, exc, target)
        if self.path.exists():
            os.replace(self.path, target)
            self.moved_aside.append(target)
        for suffix in ("-wal", "-shm", "-journal"):
            side = self.path.with_name(self.path.name + suffix)
            if side.exists():
                os.replace(side, target.with_name(target.name + suffix))

    def _recover(self, exc: sqlite3.DatabaseError) -> None:
        # Called with the lock held, when the file went bad while open.
        self._conn.close()
        self._move_aside(exc)
        self._conn = self._connect()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        # Called with the lock held. IMMEDIATE takes the write lock up front, so a concurrent
        # writer (another editor window) waits on busy_timeout instead of failing mid-way.
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    def close(self) -> None:
        """Close the database; the spool must not be used afterwards."""
        with self._lock:
            self._conn.close()

    # -- writing ------------------------------------------------------------------------------

    def append(self, events: Sequence[tuple[str, bytes]]) -> int:
        """Store `(event_id, body)` pairs durably; returns how many were new.

        An id already spooled is kept once. Events beyond the bounds push out the oldest.
        """
        if not events:
            return 0
        with self._lock:
            try:
                return self._append(events)
            except sqlite3.OperationalError:
                raise
            except sqlite3.DatabaseError as exc:
                self._recover(exc)
                return self._append(events)

    def _append(self, events: Sequence[tuple[str, bytes]]) -> int:
        oversized = [(i, b) for i, b in events if len(b) > self.max_bytes]
        fitting = [(i, b, len(b)) for i, b in events if len(b) <= self.max_bytes]
        with self._transaction() as conn:
            # rowcount counts the statement's own rows, not the triggers' counter updates.
            inserted = conn.executemany(
                "INSERT OR IGNORE INTO events (event_id, body, bytes) VALUES (?, ?, ?)", fitting
            ).rowcount
            dropped = len(oversized) + self._trim()
            if dropped:
                conn.execute(
                    "UPDATE counters SET value = value + ? WHERE name = 'dropped_events'",
                    (dropped,),
                )
        if dropped:
            log.warning("telemetry spool full: dropped %d oldest events", dropped)
        return inserted

    def _trim(self) -> int:
        conn = self._conn
        count, size = self._totals()
        excess_events = max(0, count - self.max_events)
        excess_bytes = max(0, size - self.max_bytes)
        if not excess_events and not excess_bytes:
            return 0
        # Walk from the oldest until both bounds hold; bounded by the rows we must drop.
        cut_seq, dropped, freed = None, 0, 0
        for seq, nbytes in conn.execute("SELECT seq, bytes FROM events ORDER BY seq"):
            cut_seq, dropped, freed = seq, dropped + 1, freed + nbytes
            if dropped >= excess_events and freed >= excess_bytes:
                break
        conn.execute("DELETE FROM events WHERE seq <= ?", (cut_seq,))
        return dropped

    def _totals(self) -> tuple[int, int]:
        rows = dict(
            self._conn.execute(
                "SELECT name, value FROM counters WHERE name IN ('events', 'bytes')"
            ).fetchall()
        )
        return int(rows["events"]), int(rows["bytes"])

    # -- reading and removing ----------------------------------------------------------------

    def peek(self, limit: int) -> list[SpooledEvent]:
        """The oldest `limit` events, left in place."""
        with self._lock:
            try:
                rows = self._conn.execute(
                    "SELECT seq, event_id, body FROM events ORDER BY seq LIMIT ?", (limit,)
                ).fetchall()
            except sqlite3.OperationalError:
                raise
            except sqlite3.DatabaseError as exc:
                self._recover(exc)
                return []
        return [SpooledEvent(seq, event_id, bytes(body)) for seq, event_id, body in rows]

    def remove(self, event_ids: Iterable[str]) -> int:
        """Delete delivered events; returns how many were there."""
        ids = [(event_id,) for event_id in event_ids]
        if not ids:
            return 0
        with self._lock, self._transaction() as conn:
            return int(conn.executemany("DELETE FROM events WHERE event_id = ?", ids).rowcount)

    def quarantine(self, event_ids: Iterable[str], *, status: int | None, reason: str) -> int:
        """Move events the backend refused for good into the quarantine table, and count them."""
        ids = list(event_ids)
        if not ids:
            return 0
        moved = 0
        now = time.time()
        with self._lock, self._transaction() as conn:
            for event_id in ids:
                row = conn.execute(
                    "SELECT body FROM events WHERE event_id = ?", (event_id,)
                ).fetchone()
                if row is None:
                    continue
                conn.execute(
                    "INSERT INTO quarantine (event_id, body, status, reason, at) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (event_id, row[0], status, reason[:1000], now),
                )
                conn.execute("DELETE FROM events WHERE event_id = ?", (event_id,))
                moved += 1
            conn.execute(
                "UPDATE counters SET value = value + ? WHERE name = 'quarantined_events'",
                (moved,),
            )
            self._trim_quarantine()
        log.warning("telemetry: %d events quarantined (%s: %s)", moved, status, reason[:200])
        return moved

    def _trim_quarantine(self) -> None:
        conn = self._conn
        (rows,) = conn.execute("SELECT count(*) FROM quarantine").fetchone()
        excess = rows - QUARANTINE_MAX_EVENTS
        if excess > 0:
            conn.execute(
                "DELETE FROM quarantine WHERE seq IN "
                "(SELECT seq FROM quarantine ORDER BY seq LIMIT ?)",
                (excess,),
            )
            conn.execute(
                "UPDATE counters SET value = value + ? WHERE name = 'quarantine_dropped'",
                (excess,),
            )

    def quarantined(self) -> list[tuple[str, int | None, str]]:
        """`(event_id, status, reason)` of every quarantined event, oldest first."""
        with self._lock:
            return list(
                self._conn.execute(
                    "SELECT event_id, status, reason FROM quarantine ORDER BY seq"
                ).fetchall()
            )

    def add_dropped(self, count: int) -> None:
        """Count events lost before they reached the spool (the in-memory queue overflowed)."""
        if count <= 0:
            return
        with self._lock:
            self._conn.execute(
                "UPDATE counters SET value = value + ? WHERE name = 'dropped_events'", (count,)
            )

    def stats(self) -> SpoolStats:
        """Current totals."""
        with self._lock:
            values = dict(self._conn.execute("SELECT name, value FROM counters").fetchall())
            (rows,) = self._conn.execute("SELECT count(*) FROM quarantine").fetchone()
        return SpoolStats(
            events=int(values["events"]),
            bytes=int(values["bytes"]),
            dropped_events=int(values["dropped_events"]),
            quarantined_events=int(values["quarantined_events"]),
            quarantine_rows=int(rows),
        )

    def __len__(self) -> int:
        return self.stats().events
