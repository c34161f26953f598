"""The spool under faults: a full disk, a file size limit, a damaged WAL, a truncated file.

Each loss must be counted in the spool's stats, exactly where it can be known, and reach the
client's stats (the `telemetry` part of `tabloop/status`).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from telemetry.client import TelemetryClient
from telemetry.events import OutcomeEvent
from telemetry.settings import TelemetrySettings
from telemetry.spool import Spool
from telemetry.wal import FRAME_HEADER_BYTES, HEADER_BYTES, scan_wal

ROOT = Path(__file__).resolve().parents[2]
PAGE = 4096  # SQLite's default page size, which the spool keeps


def rows(n: int, prefix: str = "e", size: int = 200) -> list[tuple[str, bytes]]:
    return [(f"{prefix}{i}", b"x" * size) for i in range(n)]


class FullDisk:
    """A connection whose COMMIT fails with ENOSPC while `full` is set, as a full disk does."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self.full = True

    def execute(self, sql: str, *args: Any) -> Any:
        if self.full and sql == "COMMIT":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def test_full_disk_counts_the_lost_events_and_stores_the_count_later(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    spool = Spool(path)
    spool.append(rows(3, "kept"))
    disk = FullDisk(spool._conn)
    spool._conn = disk  # type: ignore[assignment]
    with pytest.raises(OSError) as raised:
        spool.append(rows(5))
    assert raised.value.errno == errno.ENOSPC
    spool.add_dropped(2)  # the queue overflowed meanwhile: not storable either
    stats = spool.stats()
    assert (stats.events, stats.dropped_events, stats.write_errors) == (3, 7, 1)
    assert "No space left" in stats.last_write_error
    disk.full = False  # space again: the next commit stores the counts with its own rows
    assert spool.append(rows(2, "later")) == 2
    spool.close()
    again = Spool(path).stats()
    assert (again.events, again.dropped_events) == (5, 7)


def client_settings(**over: object) -> TelemetrySettings:
    return TelemetrySettings.model_validate({"flush_interval_s": 0.05, **over})


def test_full_disk_fails_flush_to_spool_and_shows_in_status(tmp_path: Path) -> None:
    client = TelemetryClient(client_settings(), tmp_path)
    client.start()
    assert client.spool is not None
    disk = FullDisk(client.spool._conn)
    client.spool._conn = disk  # type: ignore[assignment]
    for i in range(5):
        assert client.record(OutcomeEvent(decision_id=f"d{i}", kind="ignored"))
    assert not client.flush_to_spool(10)
    spool_stats = client.stats()["spool"]
    assert (spool_stats["events"], spool_stats["dropped_events"]) == (0, 5)
    # The writer thread may take the five events in more than one batch: each failed write counts.
    assert 1 <= spool_stats["write_errors"] <= 5
    disk.full = False
    for i in range(3):
        assert client.record(OutcomeEvent(decision_id=f"after{i}", kind="ignored"))
    assert client.flush_to_spool(10)  # a failure is reported once, to the flush that covers it
    spool_stats = client.stats()["spool"]
    assert (spool_stats["events"], spool_stats["dropped_events"]) == (3, 5)
    client.shutdown(1)
    stored = Spool(tmp_path / "spool.sqlite3").stats()
    assert (stored.events, stored.dropped_events) == (3, 5)


FILE_SIZE_LIMIT = """
import json, resource, signal, sys
from pathlib import Path
from telemetry.spool import Spool

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
spool = Spool(Path(sys.argv[1]))
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, hard))
lost = 0
for b in range(60):
    batch = [(f"b{b}-{k}", b"x" * 1000) for k in range(20)]
    try:
        spool.append(batch)
    except Exception:
        lost += len(batch)
held = spool.stats()
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
spool.close()
print(json.dumps({"lost": lost, "dropped": held.dropped_events, "errors": held.write_errors}))
"""


def test_file_size_limit_counts_every_lost_event(tmp_path: Path) -> None:
    # RLIMIT_FSIZE binds root too, unlike file permissions: a real full-disk path in SQLite.
    path = tmp_path / "s.sqlite3"
    done = subprocess.run(
        [sys.executable, "-c", FILE_SIZE_LIMIT, str(path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["lost"] > 0  # the limit was reached
    assert report["dropped"] == report["lost"]
    assert report["errors"] == report["lost"] // 20
    stats = Spool(path).stats()
    assert stats.dropped_events == report["lost"]
    assert stats.events + stats.dropped_events == 60 * 20


def spool_with_wal(directory: Path, batches: int = 10) -> Path:
    """A spool whose commits are all still in its WAL, copied as a crash would leave it."""
    live = directory / "live"
    live.mkdir()
    spool = Spool(live / "s.sqlite3")
    for b in range(batches):
        spool.append(rows(20, f"b{b}-"))
    copy = directory / "copy"
    copy.mkdir()
    for name in ("s.sqlite3", "s.sqlite3-wal"):
        shutil.copy(live / name, copy / name)
    spool.close()
    return copy / "s.sqlite3"


def damage_frame(wal: Path, frame: int) -> None:
    data = bytearray(wal.read_bytes())
    data[HEADER_BYTES + frame * (FRAME_HEADER_BYTES + PAGE) + FRAME_HEADER_BYTES + 100] ^= 0xFF
    wal.write_bytes(bytes(data))


def test_undamaged_wal_loses_nothing(tmp_path: Path) -> None:
    path = spool_with_wal(tmp_path)
    stats = Spool(path).stats()
    assert (stats.events, stats.wal_damage, stats.unknown_loss_bytes) == (200, 0, 0)


def test_damaged_wal_is_found_at_open_and_counted(tmp_path: Path) -> None:
    path = spool_with_wal(tmp_path)
    wal = path.with_name("s.sqlite3-wal")
    damage_frame(wal, 3)
    damage = scan_wal(wal)
    assert damage is not None and damage.first_bad_frame == 3
    assert damage.lost_commits >= 10  # every append after the damage, and more
    stats = Spool(path).stats()
    assert stats.events < 200  # SQLite did drop committed events
    assert stats.wal_damage == 1
    assert stats.wal_lost_commits == damage.lost_commits
    assert stats.unknown_loss_bytes == damage.lost_bytes


CRASH_AFTER_OPEN = """
import os, sys
from pathlib import Path
from telemetry.spool import Spool
Spool(Path(sys.argv[1])).append([("new", b"y")])
os._exit(0)  # no close: the log stays as it is
"""


def run_and_die(script: str, path: Path) -> None:
    """Run `script` on the spool at `path` in a process that ends without closing it."""
    subprocess.run(
        [sys.executable, "-c", script, str(path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
        timeout=60,
    )


def test_damaged_wal_is_counted_once_across_a_crash(tmp_path: Path) -> None:
    path = spool_with_wal(tmp_path)
    wal = path.with_name("s.sqlite3-wal")
    damage_frame(wal, 40)  # past some commits: the log goes on, not over
    damage = scan_wal(wal)
    assert damage is not None
    run_and_die(CRASH_AFTER_OPEN, path)
    # The new commits overwrote the damaged frame; the frames past it are still in the file,
    # behind the new ones, and look like the same damage.
    assert scan_wal(wal) is not None
    stats = Spool(path).stats()
    assert (stats.wal_damage, stats.wal_lost_commits) == (1, damage.lost_commits)
    assert stats.events >= 1


@pytest.mark.parametrize(
    ("keep", "counted"),
    [
        pytest.param(8 * PAGE, True, id="cut-after-the-counters"),
        pytest.param(1500, False, id="cut-inside-the-first-page"),
    ],
)
def test_truncated_spool_counts_what_it_held(tmp_path: Path, keep: int, counted: bool) -> None:
    path = tmp_path / "s.sqlite3"
    spool = Spool(path)
    spool.append(rows(200, size=50))
    spool.close()
    size = path.stat().st_size
    assert size > keep
    path.write_bytes(path.read_bytes()[:keep])
    fresh = Spool(path)
    stats = fresh.stats()
    assert len(fresh.moved_aside) == 1
    assert stats.corrupt_files == 1
    if counted:  # the rows of the pages kept are read back; only the rest is lost
        assert 0 < stats.events == stats.salvaged_events < 200
        assert (stats.corrupt_events, stats.unknown_loss_bytes) == (200 - stats.events, 0)
    else:
        assert stats.events == 0
        assert (stats.corrupt_events, stats.unknown_loss_bytes) == (0, keep)
    fresh.close()
    stored = Spool(path).stats()  # the counts are stored, not only held
    assert (stored.corrupt_files, stored.corrupt_events) == (1, stats.corrupt_events)
    assert stored.events == stats.events


def test_one_corrupt_page_loses_only_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    spool = Spool(path)
    for start in range(0, 300, 50):
        spool.append([(f"e{i}", b"x" * 200) for i in range(start, start + 50)])
    spool.close()
    data = bytearray(path.read_bytes())
    at = data.find(b"e150" + b"x" * 16)  # a row of the table, not of the id index
    assert at > 0
    page = at // PAGE
    data[page * PAGE : (page + 1) * PAGE] = b"\xa5" * PAGE
    path.write_bytes(bytes(data))
    fresh = Spool(path)
    stats = fresh.stats()
    assert (len(fresh.moved_aside), stats.corrupt_files) == (1, 1)
    lost = stats.corrupt_events
    assert 0 < lost <= 300 // 10, lost  # one page of rows, not the file
    assert stats.events == stats.salvaged_events == 300 - lost
    ids = {e.event_id for e in fresh.peek(300)}
    assert "e0" in ids and "e299" in ids and "e150" not in ids
    fresh.close()


KILLED_AFTER_APPENDS = """
import os, sys
from pathlib import Path
from telemetry.spool import Spool
spool = Spool(Path(sys.argv[1]))
for start in range(0, 300, 50):
    spool.append([(f"k{i}", b"z" * 100) for i in range(start, start + 50)])
os._exit(0)  # as kill -9: no close, so no checkpoint; the events are in the WAL only
"""


@pytest.mark.parametrize("wal_deleted", [True, False], ids=["wal-deleted", "wal-kept"])
def test_a_wal_deleted_after_a_crash_is_counted(tmp_path: Path, wal_deleted: bool) -> None:
    path = tmp_path / "s.sqlite3"
    Spool(path).close()  # the file exists, its events table empty
    run_and_die(KILLED_AFTER_APPENDS, path)
    wal = path.with_name("s.sqlite3-wal")
    assert wal.stat().st_size > 0
    if wal_deleted:
        wal.unlink()
        path.with_name("s.sqlite3-shm").unlink(missing_ok=True)
    spool = Spool(path)
    stats = spool.stats()
    if wal_deleted:
        assert stats.events == 0
        assert (stats.wal_missing, stats.wal_missing_events) == (1, 300)
    else:
        assert stats.events == 300
        assert (stats.wal_missing, stats.wal_missing_events) == (0, 0)
    spool.append(rows(3))
    spool.close()
    again = Spool(path).stats()  # counted once, and stored
    assert (again.wal_missing, again.wal_missing_events) == (
        stats.wal_missing,
        stats.wal_missing_events,
    )


def test_spools_sharing_a_file_never_count_a_missing_wal(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    first, second = Spool(path), Spool(path)
    for i in range(20):
        (first if i % 2 else second).append(rows(5, prefix=f"p{i}-"))
    third = Spool(path)  # opened while both write
    first.close()
    assert third.stats().wal_missing == 0
    second.close()
    third.close()
    assert Spool(path).stats().wal_missing == 0
