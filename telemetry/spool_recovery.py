"""Reading back what a damaged or crashed spool still holds (`telemetry.spool`).

- `CommitMark`: the spool's commit counters, written beside it after each commit, outside
  SQLite's files, so that a WAL deleted after a crash (and its commits) can be counted.
- `events_held`: how many events a spool file holds, for a file moved aside as corrupt.
- `salvage_events`: the rows of a damaged spool that SQLite can still read.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import struct
from pathlib import Path

log = logging.getLogger(__name__)

COMMIT_MARK = struct.Struct("<QQ")
"""The commit mark beside a spool (`<spool>.commits`): its `commits` and `appended` counters as
of its last commit, written after each commit, outside SQLite's files."""


class CommitMark:
    """The commit mark file at `path`: `(commits, appended)` as of the spool's last commit."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, commits: int, appended: int) -> None:
        # No fsync: the mark must survive a killed process, which the page cache does; after a
        # power loss it can only be older than the database, never ahead of it.
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.pwrite(fd, COMMIT_MARK.pack(commits, appended), 0)
            finally:
                os.close(fd)
        except OSError:
            log.debug("telemetry spool: commit mark not written", exc_info=True)

    def read(self) -> tuple[int, int] | None:
        try:
            data = self.path.read_bytes()
        except OSError:
            return None
        if len(data) != COMMIT_MARK.size:
            return None
        commits, appended = COMMIT_MARK.unpack(data)
        return int(commits), int(appended)


def events_held(path: Path) -> int | None:
    """How many events the spool file at `path` holds, or None when SQLite cannot tell.

    The trigger-kept counter comes first: it is one row, so it often survives damage that makes
    a walk of the whole table fail. Opened read-only, so a file kept for inspection stays as it
    was.
    """
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return None
    try:
        # Lets SQLite read a file shorter than its header says (a truncated spool) instead of
        # refusing it whole; the connection is read-only, so nothing can be written through it.
        conn.execute("PRAGMA writable_schema = ON")
        for query in (
            "SELECT value FROM counters WHERE name = 'events'",
            "SELECT count(*) FROM events",
        ):
            try:
                row = conn.execute(query).fetchone()
            except sqlite3.Error:
                continue
            if row is not None and isinstance(row[0], int) and row[0] >= 0:
                return int(row[0])
        return None
    finally:
        conn.close()


SALVAGE_QUERY = "SELECT seq, event_id, body FROM events WHERE seq > ? ORDER BY seq"


def salvage_events(path: Path) -> list[tuple[str, bytes]]:
    """The `(event_id, body)` rows of the damaged spool at `path` that SQLite can still read,
    oldest first. Opened read-only.

    A damaged page stops a scan of the table where it lies. The scan then starts again past it:
    the smallest start, above the last row read, from which the b-tree can be descended again
    is found by doubling a step and halving back (a page's rows are consecutive, so the rows
    that can be read from a start on are those past the damage). Only the damaged pages' rows
    are lost, as with SQLite's own recovery.
    """
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return []
    rows: list[tuple[str, bytes]] = []
    try:
        conn.execute("PRAGMA writable_schema = ON")  # as `events_held`: a truncated file too
        last = 0
        while True:
            try:
                for seq, event_id, body in conn.execute(SALVAGE_QUERY, (last,)):
                    if isinstance(event_id, str) and isinstance(body, bytes):
                        rows.append((event_id, body))
                    last = seq
                return rows
            except sqlite3.Error:
                resumed = _resume_after(conn, last)
                if resumed is None:
                    return rows
                last = resumed
    except sqlite3.Error:
        return rows
    finally:
        conn.close()


def _readable_from(conn: sqlite3.Connection, start: int) -> bool:
    try:
        conn.execute(
            "SELECT seq FROM events WHERE seq > ? ORDER BY seq LIMIT 1", (start,)
        ).fetchall()
    except sqlite3.Error:
        return False
    return True


def _resume_after(conn: sqlite3.Connection, failed: int) -> int | None:
    """The smallest start above `failed` from which the table reads again, or None."""
    step = 1
    while not _readable_from(conn, failed + step):
        step *= 2
        if failed + step > 2**62:
            return None
    low, high = failed + step // 2, failed + step  # low fails (or is `failed`), high reads
    while high - low > 1:
        middle = (low + high) // 2
        if _readable_from(conn, middle):
            high = middle
        else:
            low = middle
    return high
