"""The retrying HTTP client against a real loopback server that answers scripted statuses."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from email.utils import formatdate

import pytest

from common.http import (
    Backoff,
    Refused,
    RetryingClient,
    RetryPolicy,
    Unavailable,
    parse_retry_after,
)
from tests.support.scripted_http import Answer, ScriptedServer

WALL_NOW = 1_700_000_000.0


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running


class FakeClock:
    """A monotonic clock that only moves when the client sleeps: waits cost no real time, and
    every deadline decision is deterministic."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float, stop: threading.Event | None) -> bool:
        if stop is not None and stop.is_set():
            return True
        self.slept.append(seconds)
        self.now += seconds
        return False


def client_of(
    url: str, clock: FakeClock, *, deadline_s: float = 60.0, **policy: float
) -> RetryingClient:
    return RetryingClient(
        base_url=url,
        timeout_s=5.0,
        policy=RetryPolicy(
            deadline_s=deadline_s,
            backoff=Backoff(policy.get("initial_s", 1.0), policy.get("max_s", 8.0)),
            max_retry_after_s=policy.get("cap_s", 3600.0),
        ),
        rng=random.Random(3),
        clock=clock,
        wall_clock=lambda: WALL_NOW,
        sleep=clock.sleep,
    )


def test_a_2xx_answer_is_returned_after_one_request(server: ScriptedServer) -> None:
    clock = FakeClock()
    client = client_of(server.url, clock)
    response = client.post("/x", content=b"payload")
    assert response.json() == {"ok": True}
    assert server.bodies == [b"payload"]
    assert client.stats.attempts == 1 and client.stats.retries == 0
    assert client.stats.bytes_sent == len(b"payload")
    assert clock.slept == []


def test_transient_statuses_are_retried_with_jittered_doubling_backoff(
    server: ScriptedServer,
) -> None:
    server.script = [Answer(429), Answer(502), Answer(503), Answer(504)]
    clock = FakeClock()
    client = client_of(server.url, clock, initial_s=1.0, max_s=3.0)
    assert client.post("/x", content=b"b").status_code == 200
    assert len(server.bodies) == 5
    assert client.stats.retries == 4
    # Half to all of 1, 2, 3 (capped), 3 seconds.
    bases = [1.0, 2.0, 3.0, 3.0]
    assert len(clock.slept) == 4
    for slept, base in zip(clock.slept, bases, strict=True):
        assert base / 2 <= slept <= base


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        pytest.param("7", 7.0, id="delta-seconds"),
        pytest.param(formatdate(WALL_NOW + 12, usegmt=True), 12.0, id="http-date"),
        pytest.param("999999", 45.0, id="capped"),
        pytest.param(formatdate(WALL_NOW + 86400, usegmt=True), 45.0, id="http-date-capped"),
    ],
)
def test_retry_after_is_honoured_in_both_forms(
    server: ScriptedServer, header: str, expected: float
) -> None:
    server.script = [Answer(503, {"Retry-After": header})]
    clock = FakeClock()
    client = client_of(server.url, clock, cap_s=45.0)
    assert client.post("/x", content=b"b").status_code == 200
    assert clock.slept == [expected]
    assert client.stats.last_retry_delay_s == expected


@pytest.mark.parametrize(
    "header",
    [
        pytest.param("0", id="zero"),
        pytest.param(formatdate(WALL_NOW - 600, usegmt=True), id="http-date-in-the-past"),
    ],
)
def test_a_retry_after_shorter_than_the_backoff_does_not_shorten_it(
    server: ScriptedServer, header: str
) -> None:
    # `Retry-After: 0` on every answer must not become back-to-back requests until the deadline.
    server.script = [Answer(503, {"Retry-After": header}) for _ in range(30)]
    clock = FakeClock()
    client = client_of(server.url, clock, deadline_s=20.0, initial_s=1.0, max_s=4.0)
    with pytest.raises(Unavailable):
        client.post("/x", content=b"b")
    # Half to all of 1, 2, 4, 4, ... seconds: a few requests in 20 s, not 30.
    assert clock.slept and clock.slept[0] >= 0.5
    assert all(slept >= 1.0 for slept in clock.slept[1:])
    assert len(server.bodies) <= 12


def test_connection_errors_are_retried_until_the_deadline() -> None:
    with socket.socket() as placeholder:  # a port nobody listens on
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    clock = FakeClock()
    client = client_of(f"http://127.0.0.1:{port}", clock, deadline_s=10.0, initial_s=1.0)
    start = clock.now
    with pytest.raises(Unavailable) as gave_up:
        client.post("/x", content=b"b")
    assert "ConnectError" in gave_up.value.problem
    assert gave_up.value.status is None and not gave_up.value.interrupted
    assert client.stats.attempts >= 3 and client.stats.responses == 0
    assert clock.now - start <= 10.0  # no wait ran past the deadline


def test_the_deadline_bounds_every_wait(server: ScriptedServer) -> None:
    server.script = [Answer(503) for _ in range(50)]
    clock = FakeClock()
    client = client_of(server.url, clock, deadline_s=20.0, initial_s=1.0, max_s=4.0)
    start = clock.now
    with pytest.raises(Unavailable) as gave_up:
        client.post("/x", content=b"b")
    assert gave_up.value.status == 503
    assert clock.now - start <= 20.0
    assert len(server.bodies) == len(clock.slept) + 1


def test_a_retry_after_past_the_deadline_gives_up_at_once(server: ScriptedServer) -> None:
    server.script = [Answer(429, {"Retry-After": "120"})]
    clock = FakeClock()
    client = client_of(server.url, clock, deadline_s=30.0)
    with pytest.raises(Unavailable) as gave_up:
        client.post("/x", content=b"b")
    assert clock.slept == []
    assert len(server.bodies) == 1
    # The caller learns when the server will take requests again.
    assert gave_up.value.not_before == pytest.approx(clock.now + 120.0)


def test_a_timeout_is_retried(server: ScriptedServer) -> None:
    server.script = [Answer(200, stall_s=2.0)]
    clock = FakeClock()
    client = RetryingClient(
        base_url=server.url,
        timeout_s=0.2,
        policy=RetryPolicy(deadline_s=60.0, backoff=Backoff(1.0, 1.0)),
        clock=clock,
        sleep=clock.sleep,
    )
    assert client.post("/x", content=b"b").status_code == 200
    assert client.stats.retries == 1
    assert "Timeout" in client.stats.last_error


@pytest.mark.parametrize(
    "status",
    [
        pytest.param(408, id="408-stalled-upload"),
        pytest.param(500, id="500-database-timeout"),
    ],
)
def test_408_and_500_are_retried(server: ScriptedServer, status: int) -> None:
    # The backend answers 408 for a stalled upload and 500 for a database timeout: both pass.
    server.script = [Answer(status), Answer(status)]
    clock = FakeClock()
    client = client_of(server.url, clock)
    assert client.post("/x", content=b"b").status_code == 200
    assert len(server.bodies) == 3 and client.stats.retries == 2


@pytest.mark.parametrize(
    "status",
    [
        pytest.param(400, id="400"),
        pytest.param(401, id="401"),
        pytest.param(403, id="403"),
        pytest.param(404, id="404"),
        pytest.param(409, id="409"),
        pytest.param(413, id="413"),
        pytest.param(422, id="422"),
    ],
)
def test_an_answer_not_retried_is_refused_with_its_status(
    server: ScriptedServer, status: int
) -> None:
    # Whether to drop what was sent (a 422) or keep it (a 401) is the caller's decision, made
    # on the status.
    server.script = [Answer(status, body=json.dumps({"detail": "not like this"}).encode())]
    clock = FakeClock()
    client = client_of(server.url, clock)
    with pytest.raises(Refused) as refused:
        client.post("/x", content=b"b")
    assert refused.value.status == status
    assert refused.value.detail == "not like this"
    assert len(server.bodies) == 1 and clock.slept == []


def test_shutdown_interrupts_a_long_wait(server: ScriptedServer) -> None:
    server.script = [Answer(429, {"Retry-After": "3600"})]
    client = RetryingClient(base_url=server.url, policy=RetryPolicy(deadline_s=7200.0))
    outcome: list[BaseException] = []

    def send() -> None:
        try:
            client.post("/x", content=b"b")
        except BaseException as exc:
            outcome.append(exc)

    sending = threading.Thread(target=send)
    sending.start()
    assert server.seen.wait(30)
    time.sleep(0.05)  # let it reach the wait (it ends at once either way)
    client.close()
    sending.join(30)
    assert not sending.is_alive()  # not an hour
    (failure,) = outcome
    assert isinstance(failure, Unavailable) and failure.interrupted


def test_a_stopped_client_retries_when_told_the_wait_is_not_interruptible(
    server: ScriptedServer,
) -> None:
    server.script = [Answer(503)]
    clock = FakeClock()
    client = client_of(server.url, clock)
    client.stop.set()
    with pytest.raises(Unavailable):
        client.post("/x", content=b"b")
    server.script = [Answer(503)]
    # A final flush during shutdown: its own deadline bounds it, the stop event does not.
    assert client.post("/x", content=b"b", interruptible=False).status_code == 200


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        pytest.param(None, None, id="absent"),
        pytest.param(" 2.5 ", 2.5, id="fractional"),
        pytest.param("-3", 0.0, id="negative-clamped"),
        pytest.param("999999", 3600.0, id="capped"),
        pytest.param("Tue, 14 Nov 2023 22:13:27 GMT", 7.0, id="date"),
        pytest.param("soon", None, id="garbage"),
        pytest.param("nan", None, id="nan"),
    ],
)
def test_parse_retry_after(header: str | None, expected: float | None) -> None:
    assert parse_retry_after(header, now=WALL_NOW) == expected


@pytest.fixture
def local_time_not_utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A process whose local time is five hours behind UTC, as a developer's laptop may be."""
    monkeypatch.setenv("TZ", "EST+05")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    "header",
    [
        pytest.param("Tue Nov 14 22:13:27 2023", id="asctime"),
        pytest.param("Tue, 14 Nov 2023 22:13:27 -0000", id="minus-zero-zone"),
        pytest.param("Tue, 14 Nov 2023 22:13:27 GMT", id="gmt"),
    ],
)
@pytest.mark.usefixtures("local_time_not_utc")
def test_an_http_date_without_a_zone_is_utc_not_local_time(header: str) -> None:
    # Read as local time, the date would be five hours later: capped at an hour, not 7 s.
    assert parse_retry_after(header, now=WALL_NOW) == pytest.approx(7.0)


@pytest.mark.parametrize(
    ("attempt", "low", "high"),
    [
        pytest.param(0, 0.25, 0.5, id="first"),
        pytest.param(3, 2.0, 4.0, id="doubled"),
        pytest.param(10, 5.0, 10.0, id="capped"),
        pytest.param(10_000, 5.0, 10.0, id="huge-attempt"),
    ],
)
def test_backoff_is_jittered_under_its_cap(attempt: int, low: float, high: float) -> None:
    rng = random.Random(11)
    backoff = Backoff(0.5, 10.0)
    for _ in range(50):
        assert low <= backoff.delay(attempt, rng) <= high
