"""The on-disk spool: events wait here, in SQLite, until the backend has them.

Durability: the database runs in WAL mode with `synchronous=FULL`, so every committed
transaction is fsynced to the WAL before `commit()` returns; a committed event survives kill -9
and power loss. (`NORMAL` would survive kill -9 but could lose the last transactions on power
loss.) The cost, one fsync per commit, is paid by the writer thread, which commits whole batches;
callers never wait on it.

Bounds: at most `max_events` events and `max_bytes` bytes. When a new batch would exceed either,
the oldest events are dropped and the persistent `dropped_events` counter grows by exactly the
number dropped, in the same transaction.

Every loss is counted, in the spool itself (see `SpoolStats`):

- A write that fails (disk full, file size limit, locked for longer than the busy timeout) raises
  to the caller and counts its events in `dropped_events`. The count is held in memory until a
  later transaction can store it, so a full disk is counted even while nothing can be written.
- A spool that SQLite cannot read is moved aside (`spool.sqlite3.corrupt-<time>-<pid>`) and a new
  one is started, so a damaged file costs its own contents and nothing after. The rows that can
  still be read from it are spooled again (`salvaged_events`); the events it held beyond them
  are counted in `corrupt_events` when the moved file can still be read at all, else its size
  goes to `unknown_loss_bytes`.
- A damaged WAL would make SQLite's recovery drop every transaction committed after the damage,
  silently. It is checked at open (`telemetry/wal.py`); the transactions lost are counted in
  `wal_lost_commits` and their bytes in `unknown_loss_bytes` (a WAL frame holds pages, not events).
- A WAL deleted after a crash takes its commits with it, silently too. A commit mark kept beside
  the spool (`<spool>.commits`, written after each commit) is then ahead of the database's own
  commit counter at open: counted in `wal_missing` and `wal_missing_events`.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from telemetry.spool_recovery import CommitMark, events_held, salvage_events
from telemetry.wal import WalDamage, scan_wal

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
    ('quarantine_dropped', 0), ('invalid_events', 0), ('corrupt_files', 0),
    ('corrupt_events', 0), ('unknown_loss_bytes', 0), ('wal_damage', 0),
    ('wal_lost_commits', 0), ('wal_damage_mark', 0), ('salvaged_events', 0),
    ('commits', 0), ('appended', 0), ('wal_missing', 0), ('wal_missing_events', 0);
-- Every event ever spooled, for the commit mark (`Spool._check_commits`).
CREATE TRIGGER IF NOT EXISTS events_appended AFTER INSERT ON events BEGIN
    UPDATE counters SET value = value + 1 WHERE name = 'appended';
END;
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
    """Counts of the spool: persistent, except the two about this process's failed writes."""

    events: int
    bytes: int
    dropped_events: int  # bounds, queue overflow, failed writes
    quarantined_events: int  # refused by the backend, or invalid before sending
    quarantine_rows: int
    invalid_events: int = 0  # of quarantined_events: spooled bodies that were not an event
    corrupt_files: int = 0  # spool files moved aside as unreadable
    corrupt_events: int = 0  # events those files held, where they could be counted
    unknown_loss_bytes: int = 0  # uncountable losses: unreadable files, lost WAL frames
    wal_damage: int = 0  # damaged WALs found at open
    wal_lost_commits: int = 0  # committed transactions those WALs lost
    salvaged_events: int = 0  # events read back from moved files into the new spool
    wal_missing: int = 0  # WALs found missing after a crash (the commit mark was ahead)
    wal_missing_events: int = 0  # events spooled in the commits they took (at most lost)
    write_errors: int = 0  # failed writes in this process
    last_write_error: str = ""


# Counters that only grow, and may be held in memory until the disk takes them again.
LOSS_COUNTERS = (
    "dropped_events",
    "invalid_events",
    "corrupt_files",
    "corrupt_events",
    "unknown_loss_bytes",
    "wal_damage",
    "wal_lost_commits",
    "wal_missing",
    "wal_missing_events",
)
# What a failed write looks like: a full disk or file size limit surfaces as SQLITE_FULL or
# SQLITE_IOERR (both OperationalError), or as OSError from layers around SQLite.
WRITE_ERRORS = (sqlite3.OperationalError, OSError)


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
        self._mark = CommitMark(self.path.with_name(self.path.name + ".commits"))
        self.busy_timeout_s = busy_timeout_s
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.moved_aside: list[Path] = []
        self.write_errors = 0
        self.last_write_error = ""
        # Loss counts not stored yet: a full disk cannot take them, but they must not be lost.
        self._unsaved: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = self._open_or_replace()
        with self._lock:
            self._save_losses()

    # -- opening and recovery -------------------------------------------------------------

    def _check_commits(self, conn: sqlite3.Connection, existed: bool) -> None:
        """Count the commits of a WAL that was deleted after a crash: SQLite opens without it
        and without a word, the database as of its last checkpoint. The commit mark, written
        outside SQLite's files after each commit, is then ahead of the database's counter."""
        # Under the write lock: no other process commits between the two reads, and a mark is
        # only ever written after its commit, so without a loss it is never ahead.
        conn.execute("BEGIN IMMEDIATE")
        try:
            stored = dict(
                conn.execute(
                    "SELECT name, value FROM counters WHERE name IN ('commits', 'appended')"
                ).fetchall()
            )
            mark = self._mark.read() if existed else None
        finally:
            conn.execute("COMMIT")
        commits, appended = int(stored["commits"]), int(stored["appended"])
        if mark is not None and mark[0] > commits:
            lost_events = max(0, mark[1] - appended)
            log.warning(
                "telemetry spool %s: WAL missing: %d commits (%d events spooled in them) lost",
                self.path,
                mark[0] - commits,
                lost_events,
            )
            self._unsaved.update(wal_missing=1, wal_missing_events=lost_events)
        if mark != (commits, appended):
            self._mark.write(commits, appended)

    def _connect(self) -> sqlite3.Connection:
        existed = self.path.exists()
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
            damage = self._check_wal(conn)
            conn.executescript(_SCHEMA)
            if damage is not None:
                self._note_wal_damage(conn, damage)
            self._check_commits(conn, existed)
        except (sqlite3.DatabaseError, SpoolCorrupt):
            conn.close()
            raise
        return conn

    def _check_wal(self, conn: sqlite3.Connection) -> WalDamage | None:
        # Before anything is written: the next write overwrites the frames past the damage. The
        # write lock keeps another process's writer off the log while it is read.
        conn.execute("BEGIN IMMEDIATE")
        try:
            return scan_wal(self.path.with_name(self.path.name + "-wal"))
        finally:
            conn.execute("COMMIT")  # nothing was written; this only lets go of the lock

    def _note_wal_damage(self, conn: sqlite3.Connection, damage: WalDamage) -> None:
        (mark,) = conn.execute(
            "SELECT value FROM counters WHERE name = 'wal_damage_mark'"
        ).fetchone()
        if mark == damage.salts:
            # Counted at an earlier open: the frames past the damage stay in the file, behind
            # the new ones, until the log starts its next generation.
            return
        log.warning(
            "telemetry spool %s: damaged WAL (frame %d) lost %d committed transactions",
            self.path,
            damage.first_bad_frame,
            damage.lost_commits,
        )
        self._unsaved.update(
            wal_damage=1,
            wal_lost_commits=damage.lost_commits,
            unknown_loss_bytes=damage.lost_bytes,
        )
        try:
            conn.execute(
                "UPDATE counters SET value = ? WHERE name = 'wal_damage_mark'", (damage.salts,)
            )
        except WRITE_ERRORS:
            log.debug("could not mark the WAL damage as counted", exc_info=True)

    def _open_or_replace(self) -> sqlite3.Connection:
        try:
            return self._connect()
        except sqlite3.OperationalError:
            raise  # locked or unwritable: not corruption, do not destroy anything
        except (sqlite3.DatabaseError, SpoolCorrupt) as exc:
            salvaged = self._move_aside(exc)
            conn = self._connect()
            self._restore(conn, salvaged)
            return conn

    def _restore(self, conn: sqlite3.Connection, salvaged: list[tuple[str, bytes]]) -> None:
        """Spool again the events read back from a moved file (the new spool is empty)."""
        if not salvaged:
            return
        fitting = [(i, b, len(b)) for i, b in salvaged if len(b) <= self.max_bytes]
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.executemany(
                "INSERT OR IGNORE INTO events (event_id, body, bytes) VALUES (?, ?, ?)", fitting
            )
            conn.execute(
                "UPDATE counters SET value = value + ? WHERE name = 'salvaged_events'",
                (len(fitting),),
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            # Not spooled again after all: they count as the moved file's losses.
            self._unsaved["corrupt_events"] += len(salvaged)
            log.warning("telemetry spool: %d salvaged events lost", len(salvaged), exc_info=True)
            return
        self._unsaved["corrupt_events"] += len(salvaged) - len(fitting)
        log.warning("telemetry spool %s: %d events salvaged", self.path, len(fitting))

    def _move_aside(self, exc: BaseException) -> list[tuple[str, bytes]]:
        """Move the unreadable spool aside; returns the events that could still be read from
        it (to spool again), having counted those that could not."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        target = self.path.with_name(f"{self.path.name}.corrupt-{stamp}-{os.getpid()}")
        log.warning("telemetry spool %s is unreadable (%s); moved to %s", self.path, exc, target)
        moved: list[Path] = []
        if self.path.exists():
            os.replace(self.path, target)
            self.moved_aside.append(target)
            moved.append(target)
        for suffix in ("-wal", "-shm", "-journal"):
            side = self.path.with_name(self.path.name + suffix)
            if side.exists():
                os.replace(side, target.with_name(target.name + suffix))
                moved.append(target.with_name(target.name + suffix))
        if self._mark.path.exists():  # the new spool starts its own count
            os.replace(self._mark.path, target.with_name(target.name + ".commits"))
        if not moved:
            return []
        held = events_held(target) if target in moved else None
        salvaged = salvage_events(target) if target in moved else []
        self._unsaved["corrupt_files"] += 1
        if held is not None:
            self._unsaved["corrupt_events"] += max(0, held - len(salvaged))
        elif not salvaged:
            self._unsaved["unknown_loss_bytes"] += sum(
                path.stat().st_size for path in moved if not path.name.endswith("-shm")
            )
        log.warning(
            "telemetry spool %s held %s events; %d read back",
            target,
            "an unknown number of" if held is None else held,
            len(salvaged),
        )
        return salvaged

    def _recover(self, exc: sqlite3.DatabaseError) -> None:
        # Called with the lock held, when the file went bad while open.
        self._conn.close()
        salvaged = self._move_aside(exc)
        self._conn = self._connect()
        self._restore(self._conn, salvaged)
        self._save_losses()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        # Called with the lock held. IMMEDIATE takes the write lock up front, so a concurrent
        # writer (another editor window) waits on busy_timeout instead of failing mid-way.
        # Loss counts held in memory ride along with whatever commits next.
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        saving = Counter(self._unsaved)
        try:
            yield conn
            for name, value in saving.items():
                conn.execute("UPDATE counters SET value = value + ? WHERE name = ?", (value, name))
            conn.execute("UPDATE counters SET value = value + 1 WHERE name = 'commits'")
            mark = dict(
                conn.execute(
                    "SELECT name, value FROM counters WHERE name IN ('commits', 'appended')"
                ).fetchall()
            )
            conn.execute("COMMIT")
        except BaseException:
            # A failed COMMIT (disk full) may leave the transaction open, or SQLite may have
            # rolled it back already; either way the connection must be usable afterwards.
            if conn.in_transaction:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    log.debug("rollback failed", exc_info=True)
            raise
        self._unsaved -= saving
        self._mark.write(int(mark["commits"]), int(mark["appended"]))

    def _save_losses(self) -> None:
        # Called with the lock held. When the disk still refuses, the counts stay in memory
        # (and in stats()) for the next transaction.
        if not self._unsaved:
            return
        try:
            with self._transaction():
                pass
        except WRITE_ERRORS:
            log.debug("telemetry spool: loss counts kept in memory for now", exc_info=True)

    def close(self) -> None:
        """Close the database; the spool must not be used afterwards."""
        with self._lock:
            self._save_losses()
            self._conn.close()

    # -- writing ------------------------------------------------------------------------------

    def append(self, events: Sequence[tuple[str, bytes]]) -> int:
        """Store `(event_id, body)` pairs durably; returns how many were new.

        An id already spooled is kept once. Events beyond the bounds push out the oldest. When
        the write fails (disk full, locked too long) the events are counted in `dropped_events`
        and the error is raised.
        """
        if not events:
            return 0
        with self._lock:
            try:
                try:
                    return self._append(events)
                except sqlite3.OperationalError:
                    raise
                except sqlite3.DatabaseError as exc:
                    self._recover(exc)
                    return self._append(events)
            except Exception as exc:
                self.write_errors += 1
                self.last_write_error = f"{type(exc).__name__}: {exc}"[:300]
                self._unsaved["dropped_events"] += len(events)
                log.warning("telemetry spool: %d events lost: %s", len(events), exc)
                raise

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

    def quarantine(
        self, event_ids: Iterable[str], *, status: int | None, reason: str, invalid: bool = False
    ) -> int:
        """Move events refused for good into the quarantine table, and count them.

        `invalid` marks events the sender found unsendable itself (status None): they are also
        counted in `invalid_events`.
        """
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
            if invalid:
                conn.execute(
                    "UPDATE counters SET value = value + ? WHERE name = 'invalid_events'",
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
            self._unsaved["dropped_events"] += count
            self._save_losses()

    def stats(self) -> SpoolStats:
        """Current totals, with loss counts not yet stored included."""
        with self._lock:
            values = dict(self._conn.execute("SELECT name, value FROM counters").fetchall())
            (rows,) = self._conn.execute("SELECT count(*) FROM quarantine").fetchone()
            for name, value in self._unsaved.items():
                values[name] = values.get(name, 0) + value
        return SpoolStats(
            events=int(values["events"]),
            bytes=int(values["bytes"]),
            dropped_events=int(values["dropped_events"]),
            quarantined_events=int(values["quarantined_events"]),
            quarantine_rows=int(rows),
            invalid_events=int(values["invalid_events"]),
            corrupt_files=int(values["corrupt_files"]),
            corrupt_events=int(values["corrupt_events"]),
            unknown_loss_bytes=int(values["unknown_loss_bytes"]),
            wal_damage=int(values["wal_damage"]),
            wal_lost_commits=int(values["wal_lost_commits"]),
            salvaged_events=int(values.get("salvaged_events", 0)),
            wal_missing=int(values.get("wal_missing", 0)),
            wal_missing_events=int(values.get("wal_missing_events", 0)),
            write_errors=self.write_errors,
            last_write_error=self.last_write_error,
        )

    def __len__(self) -> int:
        return self.stats().events
