"""The on-disk spool: durability, bounds, the dropped counter, corruption, quarantine."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from telemetry.spool import Spool

ROOT = Path(__file__).resolve().parents[2]


def rows(n: int, size: int = 10, start: int = 0) -> list[tuple[str, bytes]]:
    return [(f"e{start + i}", b"x" * size) for i in range(n)]


def test_fifo_append_peek_remove(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite3")
    assert spool.append(rows(5)) == 5
    assert spool.append(rows(2)) == 0  # ids already spooled are kept once
    assert [e.event_id for e in spool.peek(3)] == ["e0", "e1", "e2"]
    assert spool.remove(["e1", "e0", "nope"]) == 2
    assert [e.event_id for e in spool.peek(10)] == ["e2", "e3", "e4"]
    stats = spool.stats()
    assert (stats.events, stats.bytes, stats.dropped_events) == (3, 30, 0)


def test_committed_events_survive_reopen(tmp_path: Path) -> None:
    Spool(tmp_path / "s.sqlite3").append(rows(3))  # never closed, like a crash
    again = Spool(tmp_path / "s.sqlite3")
    assert [e.event_id for e in again.peek(10)] == ["e0", "e1", "e2"]
    assert again.stats().events == 3


@pytest.mark.parametrize(
    ("max_events", "max_bytes", "batches", "kept", "dropped"),
    [
        pytest.param(5, 10_000, [3, 3, 3], ["e4", "e5", "e6", "e7", "e8"], 4, id="by-count"),
        pytest.param(100, 1024 + 0, [60, 60], None, None, id="by-bytes"),
        pytest.param(3, 10_000, [10], ["e7", "e8", "e9"], 7, id="one-batch-over"),
        pytest.param(10, 10_000, [4, 4], None, 0, id="within-bounds"),
    ],
)
def test_bounds_drop_oldest_and_count_exactly(
    tmp_path: Path,
    max_events: int,
    max_bytes: int,
    batches: list[int],
    kept: list[str] | None,
    dropped: int | None,
) -> None:
    spool = Spool(tmp_path / "s.sqlite3", max_events=max_events, max_bytes=max_bytes)
    start = 0
    for n in batches:
        spool.append(rows(n, size=20, start=start))
        start += n
    stats = spool.stats()
    assert stats.events <= max_events
    assert stats.bytes <= max_bytes
    assert stats.events + stats.dropped_events == sum(batches)
    ids = [e.event_id for e in spool.peek(1000)]
    if kept is not None:
        assert ids == kept
    if dropped is not None:
        assert stats.dropped_events == dropped
    # The newest events are the ones kept, and the counter persists.
    assert ids == [f"e{i}" for i in range(sum(batches) - len(ids), sum(batches))]
    assert Spool(tmp_path / "s.sqlite3").stats().dropped_events == stats.dropped_events


def test_event_larger_than_the_spool_is_dropped_not_the_rest(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite3", max_bytes=1024)
    spool.append(rows(3))
    spool.append([("huge", b"y" * 2000), ("small", b"z")])
    assert [e.event_id for e in spool.peek(10)] == ["e0", "e1", "e2", "small"]
    assert spool.stats().dropped_events == 1


@pytest.mark.parametrize(
    ("damage", "held"),
    [
        pytest.param(
            lambda p: p.write_bytes(b"this is not a database at all" * 100), None, id="garbage"
        ),
        pytest.param(lambda p: p.write_bytes(p.read_bytes()[:1500]), None, id="truncated"),
        pytest.param(
            lambda p: p.write_bytes(p.read_bytes()[:100] + b"\xff" * 4000 + p.read_bytes()[4100:]),
            None,
            id="overwritten-pages",
        ),
    ],
)
def test_corrupt_spool_is_moved_aside_and_its_loss_counted(
    tmp_path: Path, damage: object, held: int | None
) -> None:
    path = tmp_path / "s.sqlite3"
    spool = Spool(path)
    spool.append(rows(200, size=50))
    spool.close()
    damage(path)  # type: ignore[operator]
    damaged_size = path.stat().st_size
    fresh = Spool(path)
    assert len(fresh.moved_aside) == 1
    assert fresh.moved_aside[0].exists()
    assert fresh.moved_aside[0].name.startswith("s.sqlite3.corrupt-")
    stats = fresh.stats()
    assert (stats.events, stats.corrupt_files) == (0, 1)
    if held is None:  # unreadable: its size is what we know
        assert (stats.corrupt_events, stats.unknown_loss_bytes) == (0, damaged_size)
    else:  # counted from what it still holds (test_spool_faults.py cuts one after a page)
        assert (stats.corrupt_events, stats.unknown_loss_bytes) == (held, 0)
    assert fresh.append(rows(2)) == 2
    assert [e.event_id for e in fresh.peek(5)] == ["e0", "e1"]


def test_quarantine_moves_and_counts(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.sqlite3")
    spool.append(rows(4))
    assert spool.quarantine(["e1", "e3", "missing"], status=400, reason="bad event") == 2
    assert [e.event_id for e in spool.peek(10)] == ["e0", "e2"]
    assert spool.quarantined() == [("e1", 400, "bad event"), ("e3", 400, "bad event")]
    stats = spool.stats()
    assert (stats.events, stats.quarantined_events, stats.quarantine_rows) == (2, 2, 2)


def test_locked_database_is_not_treated_as_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    Spool(path).append(rows(1))
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # another process is writing
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            Spool(path, busy_timeout_s=0.05)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert not list(tmp_path.glob("*.corrupt-*"))
    assert Spool(path).stats().events == 1


WRITER = """
import sys
from pathlib import Path
from telemetry.spool import Spool
spool = Spool(Path(sys.argv[1]))
i = 0
while True:
    spool.append([(f"e{i + k}", b"payload" * 20) for k in range(10)])
    i += 10
    print(i, flush=True)  # printed only after the commit returned
"""


def test_every_committed_batch_survives_kill_9(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    process = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    committed = 0
    for line in process.stdout:
        committed = int(line)
        if committed >= 300:
            break
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    spool = Spool(path)
    ids = {e.event_id for e in spool.peek(100_000)}
    assert {f"e{i}" for i in range(committed)} <= ids
    assert spool.stats().events == len(ids)
