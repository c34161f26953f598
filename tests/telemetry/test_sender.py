"""The sender against the real backend on loopback: delivery, retries, quarantine, outages."""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from telemetry.events import DecisionEvent, OutcomeEvent
from telemetry.sender import Export, Sender, encode_batch, parse_retry_after
from telemetry.spool import Spool
from tests.support.backend_server import BackendServer


def spool_with(tmp_path: Path, n: int) -> tuple[Spool, list[str]]:
    spool = Spool(tmp_path / "spool.sqlite3")
    events = [OutcomeEvent(decision_id=f"d{i}", kind="ignored") for i in range(n)]
    spool.append([(str(e.event_id), e.model_dump_json().encode()) for e in events])
    return spool, [str(e.event_id) for e in events]


def sender_for(spool: Spool, backend: BackendServer, **over: float) -> Sender:
    options: dict[str, float] = {
        "batch_size": 100,
        "flush_interval_s": 0.05,
        "request_timeout_s": 5.0,
        "retry_deadline_s": 5.0,
        "backoff_initial_s": 0.01,
        "backoff_max_s": 0.05,
        **over,
    }
    return Sender(
        spool,
        url=backend.url,
        token=backend.token,
        rng=random.Random(7),
        **options,  # type: ignore[arg-type]
    )


def far() -> float:
    return time.monotonic() + 30


def test_round_trip_deletes_only_what_the_backend_has(
    tmp_path: Path, backend: BackendServer
) -> None:
    spool, ids = spool_with(tmp_path, 250)
    sender = sender_for(spool, backend)
    assert sender.drain(far())
    assert len(spool) == 0
    assert sorted(backend.stored_ids()) == sorted(ids)
    assert sender.stats.sent_events == 250
    # Batches of at most 100, gzipped, with the tenant's token.
    sizes = [len(json.loads(body)["events"]) for body in backend.bodies]
    assert sizes == [100, 100, 50]


def test_replayed_events_count_as_delivered(tmp_path: Path, sqlite_backend: BackendServer) -> None:
    spool, ids = spool_with(tmp_path, 10)
    batch = spool.peek(10)
    sender = sender_for(spool, sqlite_backend)
    assert sender.export(batch, far()) is Export.DELIVERED
    spool.append([(e.event_id, e.body) for e in batch])  # as if the delete had been lost
    assert sender.drain(far())
    assert sender.stats.duplicate_events == 10
    assert sorted(sqlite_backend.stored_ids()) == sorted(ids)


@pytest.mark.parametrize(
    ("faults", "retry_after", "expected_delay"),
    [
        pytest.param([429], "1", 1.0, id="429-retry-after-seconds"),
        pytest.param([429], None, None, id="429-without-retry-after"),
        pytest.param([503, 502, 504], None, None, id="5xx-transient"),
        pytest.param([408, 500], None, None, id="408-stalled-upload-500-database-timeout"),
        # A floor, not a replacement: zero leaves the jittered backoff in place.
        pytest.param([503], "0", None, id="503-retry-after-zero"),
    ],
)
def test_transient_failures_are_retried(
    tmp_path: Path,
    sqlite_backend: BackendServer,
    faults: list[int],
    retry_after: str | None,
    expected_delay: float | None,
) -> None:
    spool, ids = spool_with(tmp_path, 5)
    sqlite_backend.faults.add(*faults, retry_after=retry_after)
    sender = sender_for(spool, sqlite_backend)
    assert sender.drain(far())
    assert sender.stats.retries == len(faults)
    assert sqlite_backend.statuses == [*faults, 200]
    assert sorted(sqlite_backend.stored_ids()) == sorted(ids)
    if expected_delay is not None:
        assert sender.stats.last_retry_delay_s == expected_delay
    else:  # jittered backoff: between half and all of the doubled initial delay
        assert 0.005 <= sender.stats.last_retry_delay_s <= 0.01 * 2 ** (len(faults) - 1)


@pytest.mark.parametrize(
    "status",
    [
        pytest.param(400, id="400"),
        pytest.param(413, id="413-single-event"),
        pytest.param(422, id="422"),
    ],
)
def test_refusals_of_the_events_are_quarantined_not_retried(
    tmp_path: Path, sqlite_backend: BackendServer, status: int
) -> None:
    spool, ids = spool_with(tmp_path, 1)
    sqlite_backend.faults.add(status)
    sender = sender_for(spool, sqlite_backend)
    assert sender.drain(far())
    assert sqlite_backend.statuses == [status]  # one request, no retry
    assert sender.stats.retries == 0
    assert len(spool) == 0
    assert [row[0] for row in spool.quarantined()] == ids
    assert spool.stats().quarantined_events == 1
    assert sqlite_backend.stored_ids() == []


@pytest.mark.parametrize(
    "status",
    [
        pytest.param(401, id="401-rotated-token"),
        pytest.param(403, id="403"),
        pytest.param(404, id="404-proxy-or-wrong-url"),
        pytest.param(405, id="405"),
        pytest.param(410, id="410"),
    ],
)
def test_refusals_of_the_client_keep_the_whole_spool(
    tmp_path: Path, sqlite_backend: BackendServer, status: int
) -> None:
    spool, ids = spool_with(tmp_path, 500)
    sqlite_backend.faults.add(status)
    sender = sender_for(spool, sqlite_backend)
    before = time.monotonic()
    assert not sender.drain(far())  # not "emptied"
    # One request, no retry, no next batch (bodies are recorded before the answer is sent;
    # statuses after, so they may lag the client).
    assert len(sqlite_backend.bodies) == 1
    assert len(spool) == 500
    assert spool.quarantined() == []
    assert (spool.stats().quarantined_events, sender.stats.quarantined_events) == (0, 0)
    assert sender.stats.last_error.startswith(f"HTTP {status}: ")
    assert sender.stats.refusals == 1
    # The background loop rests for minutes (half to all of refused_rest_s), not seconds.
    assert sender._not_before >= before + 150
    # Once the backend takes the requests again, every event is delivered.
    assert sender.drain(far())
    assert sqlite_backend.statuses == [status] + [200] * 5
    assert sorted(sqlite_backend.stored_ids()) == sorted(ids)
    assert spool.quarantined() == []


def test_a_rotated_token_loses_nothing_and_a_working_token_sends_it_all(
    tmp_path: Path, sqlite_backend: BackendServer
) -> None:
    spool, ids = spool_with(tmp_path, 500)
    # The real backend's own 401, not a scripted one.
    stale = Sender(spool, url=sqlite_backend.url, token="tl_revoked", retry_deadline_s=5.0)
    try:
        assert not stale.drain(far())
    finally:
        stale.shutdown(0)
    assert len(sqlite_backend.bodies) == 1
    assert "HTTP 401" in stale.stats.last_error
    assert (len(spool), spool.stats().quarantined_events) == (500, 0)
    sender = sender_for(spool, sqlite_backend)
    assert sender.drain(far())
    assert sorted(sqlite_backend.stored_ids()) == sorted(ids)
    assert spool.stats().quarantined_events == 0


def test_the_background_sender_rests_after_a_refusal_of_the_client(
    tmp_path: Path, sqlite_backend: BackendServer
) -> None:
    spool, ids = spool_with(tmp_path, 5)
    sqlite_backend.faults.add(401)
    sender = sender_for(spool, sqlite_backend, refused_rest_s=60.0)
    # The rest is a wait on the stop event of 30-60 s (its other waits, backoffs, are at most
    # 0.05 s): once the loop enters it, a sender that did not rest would have sent again.
    resting = threading.Event()
    stop_wait = sender._stop.wait

    def wait(timeout: float | None = None) -> bool:
        if timeout is not None and timeout >= 30:
            resting.set()
        return stop_wait(timeout)

    sender._stop.wait = wait  # type: ignore[method-assign]
    sender.start()
    assert resting.wait(30), sqlite_backend.statuses
    assert sqlite_backend.statuses == [401] and len(sqlite_backend.bodies) == 1
    assert len(spool) == 5 and spool.quarantined() == []
    # Shutdown's final flush still tries (and here succeeds); it is not held to the rest.
    assert sender.shutdown(timeout=5.0)
    assert sorted(sqlite_backend.stored_ids()) == sorted(ids)


def test_413_splits_the_batch_before_giving_up(
    tmp_path: Path, sqlite_backend: BackendServer
) -> None:
    spool, ids = spool_with(tmp_path, 8)
    sqlite_backend.faults.add(413, 413)
    sender = sender_for(spool, sqlite_backend)
    assert sender.drain(far())
    sizes = [len(json.loads(body)["events"]) for body in sqlite_backend.bodies]
    assert sizes[:3] == [8, 4, 2]
    assert sorted(sqlite_backend.stored_ids()) == sorted(ids)
    assert spool.stats().quarantined_events == 0


def test_events_the_backend_rejects_are_quarantined_the_rest_delivered(
    tmp_path: Path, sqlite_backend: BackendServer
) -> None:
    spool, ids = spool_with(tmp_path, 3)
    # Valid here, refused there: escaped control characters make it larger than the backend's
    # per-event limit (128 KiB).
    huge = DecisionEvent(
        decision_id="d",
        session_id="s",
        install_id="i",
        language="python",
        trigger="automatic",
        policy_version="p",
        model_id="m",
        action="show",
        propensity=0.5,
        prompt="\x01" * 32_768,
    )
    spool.append([(str(huge.event_id), huge.model_dump_json().encode())])
    sender = sender_for(spool, sqlite_backend)
    assert sender.drain(far())
    assert sorted(sqlite_backend.stored_ids()) == sorted(ids)
    (quarantined,) = spool.quarantined()
    assert quarantined == (str(huge.event_id), 200, "event too large")
    assert (spool.stats().quarantined_events, spool.stats().invalid_events) == (1, 0)


BAD_BODIES = [
    pytest.param(b'{"type":"outcome","kind":"gone"', "invalid spooled body", id="not-json"),
    pytest.param(b"\xff\xfe{}", "invalid spooled body", id="not-utf8"),
    pytest.param(b"[1, 2]", "invalid spooled body", id="not-an-object"),
    pytest.param(b'{"type":"outcome","kind":"gone"}', "invalid spooled body", id="not-an-event"),
    pytest.param(
        OutcomeEvent(decision_id="other", kind="ignored").model_dump_json().encode(),
        "spooled body has event_id",
        id="another-id",
    ),
]


@pytest.mark.parametrize(("body", "reason"), BAD_BODIES)
def test_one_corrupt_body_among_100_costs_only_itself(
    tmp_path: Path, sqlite_backend: BackendServer, body: bytes, reason: str
) -> None:
    spool, ids = spool_with(tmp_path, 100)
    # Damage one row in place, in the middle of the batch, as a bad disk sector would.
    bad_id = ids[40]
    conn = sqlite3.connect(tmp_path / "spool.sqlite3")
    with conn:
        conn.execute("UPDATE events SET body = ? WHERE event_id = ?", (body, bad_id))
    conn.close()
    sender = sender_for(spool, sqlite_backend)
    assert sender.drain(far())
    assert sqlite_backend.statuses == [200]  # one request, not refused
    assert sorted(sqlite_backend.stored_ids()) == sorted(set(ids) - {bad_id})
    assert len(json.loads(sqlite_backend.bodies[0])["events"]) == 99
    assert sender.stats.sent_events == 99
    assert (sender.stats.quarantined_events, sender.stats.invalid_events) == (1, 1)
    ((event_id, status, why),) = spool.quarantined()
    assert (event_id, status) == (bad_id, None)
    assert why.startswith(reason)
    stats = spool.stats()
    assert (stats.events, stats.quarantined_events, stats.invalid_events) == (0, 1, 1)
    assert stats.dropped_events == 0


def test_a_batch_of_nothing_but_corrupt_bodies_sends_nothing(
    tmp_path: Path, sqlite_backend: BackendServer
) -> None:
    spool = Spool(tmp_path / "spool.sqlite3")
    spool.append([(f"bad{i}", b"{") for i in range(3)])
    sender = sender_for(spool, sqlite_backend)
    assert sender.drain(far())
    assert sqlite_backend.statuses == []
    assert spool.stats().invalid_events == 3
    assert len(spool) == 0


def test_backend_down_keeps_events_until_deadline(tmp_path: Path) -> None:
    with BackendServer() as backend:
        spool, ids = spool_with(tmp_path, 20)
        backend.stop_serving()
        sender = sender_for(spool, backend, retry_deadline_s=0.3)
        started = time.monotonic()
        assert not sender.drain(time.monotonic() + 0.3)
        assert time.monotonic() - started < 5  # bounded by the deadline, not stuck
        assert len(spool) == 20
        assert "ConnectError" in sender.stats.last_error
        backend.start_serving()
        assert sender.drain(far())
        assert sorted(backend.stored_ids()) == sorted(ids)


def test_unreadable_2xx_answer_keeps_the_events(tmp_path: Path) -> None:
    with BackendServer() as backend:
        spool, ids = spool_with(tmp_path, 3)
        backend.faults.add(200)  # a 200 whose body is not an ingest answer
        sender = sender_for(spool, backend)
        assert sender.export(spool.peek(10), far()) is Export.PENDING
        assert len(spool) == 3
        assert sender.drain(far())
        assert sorted(backend.stored_ids()) == sorted(ids)


def test_shutdown_interrupts_a_long_retry_after_and_keeps_events(
    tmp_path: Path, sqlite_backend: BackendServer
) -> None:
    spool, _ = spool_with(tmp_path, 5)
    sqlite_backend.faults.add(*([429] * 50), retry_after="3600")
    sender = sender_for(spool, sqlite_backend, retry_deadline_s=7200)
    sender.start()
    while not sqlite_backend.statuses:
        time.sleep(0.01)
    started = time.monotonic()
    assert not sender.shutdown(timeout=0.5)
    assert time.monotonic() - started < 10  # not an hour
    assert len(spool) == 5


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        pytest.param(None, None, id="absent"),
        pytest.param("7", 7.0, id="seconds"),
        pytest.param(" 2.5 ", 2.5, id="fractional"),
        pytest.param("-3", 0.0, id="negative-clamped"),
        pytest.param("999999", 3600.0, id="capped"),
        pytest.param("Wed, 21 Oct 2015 07:28:00 GMT", 0.0, id="date-in-the-past"),
        pytest.param("soon", None, id="garbage"),
        pytest.param("nan", None, id="nan"),
    ],
)
def test_parse_retry_after(header: str | None, expected: float | None) -> None:
    assert parse_retry_after(header) == expected


def test_parse_retry_after_date_in_the_future() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after("Tue, 14 Nov 2023 22:13:27 GMT", now=now) == pytest.approx(7.0)


def test_encode_batch_is_valid_gzipped_json(tmp_path: Path) -> None:
    import gzip

    spool, ids = spool_with(tmp_path, 3)
    payload = json.loads(gzip.decompress(encode_batch(spool.peek(3))))
    assert [e["event_id"] for e in payload["events"]] == ids
