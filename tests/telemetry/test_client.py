"""The telemetry client end to end: record, spool, send to the real backend, shut down."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from telemetry.client import TelemetryClient, install_id
from telemetry.events import DecisionEvent, OutcomeEvent
from telemetry.sender import Sender
from telemetry.settings import TelemetrySettings
from tests.support.backend_server import BackendServer


def settings(backend: BackendServer | None = None, **over: object) -> TelemetrySettings:
    values: dict[str, object] = {
        "backend_url": backend.url if backend else "",
        "token": backend.token if backend else "",
        "flush_interval_s": 0.05,
        "backoff_initial_s": 0.02,
        "backoff_max_s": 0.2,
        "retry_deadline_s": 2.0,
        "shutdown_timeout_s": 5.0,
        **over,
    }
    return TelemetrySettings.model_validate(values)


def decision(**over: object) -> DecisionEvent:
    values: dict[str, object] = {
        "decision_id": "d1",
        "session_id": "s",
        "install_id": "i",
        "language": "python",
        "trigger": "automatic",
        "policy_version": "builtin",
        "model_id": "m",
        "action": "show",
        "propensity": 0.5,
        **over,
    }
    return DecisionEvent.model_validate(values)


def wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def one_round(sender: Sender) -> None:
    """Wake the sender's background loop and return once the round it woke for has ended: the
    loop takes (clears) a wake only between rounds, so a second wake is taken after it."""
    for _ in range(2):
        sender.wake()
        wait_for(lambda: not sender._wake.is_set())


def test_thousands_recorded_while_the_backend_is_down_all_arrive_once(
    tmp_path: Path, sqlite_backend: BackendServer
) -> None:
    sqlite_backend.stop_serving()
    client = TelemetryClient(settings(sqlite_backend), tmp_path)
    client.start()
    events = [OutcomeEvent(decision_id=f"d{i}", kind="ignored") for i in range(3000)]
    for event in events:
        assert client.record(event)
    assert client.flush_to_spool(30)
    sender = client.sender
    assert sender is not None
    wait_for(lambda: "ConnectError" in sender.stats.last_error)  # it met the closed port
    assert sender.stats.sent_events == 0
    sqlite_backend.start_serving()
    wait_for(lambda: client.spool is not None and len(client.spool) == 0)
    stored = sqlite_backend.stored_ids()
    assert len(stored) == len(set(stored)) == 3000
    assert set(stored) == {str(e.event_id) for e in events}
    assert client.shutdown(5)


def test_shutdown_flushes_and_what_is_left_goes_next_time(
    tmp_path: Path, sqlite_backend: BackendServer
) -> None:
    sqlite_backend.stop_serving()
    first = TelemetryClient(settings(sqlite_backend, flush_interval_s=60), tmp_path)
    first.start()
    events = [OutcomeEvent(decision_id=f"d{i}", kind="dismissed") for i in range(50)]
    for event in events:
        first.record(event)
    started = time.monotonic()
    assert not first.shutdown(0.3)  # backend down: gives up at its timeout
    assert time.monotonic() - started < 10
    sqlite_backend.start_serving()
    second = TelemetryClient(settings(sqlite_backend), tmp_path)
    second.start()
    assert second.shutdown(10)
    assert sorted(sqlite_backend.stored_ids()) == sorted(str(e.event_id) for e in events)


@pytest.mark.parametrize(
    ("level", "client_enabled", "recorded"),
    [
        pytest.param("off", True, False, id="level-off"),
        pytest.param("metrics", False, False, id="editor-telemetry-off"),
        pytest.param("metrics", True, True, id="metrics"),
        pytest.param("full", True, True, id="full"),
    ],
)
def test_level_and_editor_switch(
    tmp_path: Path, level: str, client_enabled: bool, recorded: bool
) -> None:
    client = TelemetryClient(settings(level=level, client_enabled=client_enabled), tmp_path)
    client.start()
    assert client.record(decision()) is recorded
    assert (client.spool is not None) is recorded  # off never even creates the spool
    assert client.flush_to_spool(10)
    if recorded:
        assert client.spool is not None and len(client.spool) == 1
    client.shutdown(1)
    assert (tmp_path / "spool.sqlite3").exists() is recorded


def test_turning_the_editor_switch_on_later_starts_recording(tmp_path: Path) -> None:
    client = TelemetryClient(settings(client_enabled=False), tmp_path)
    client.start()
    assert not client.record(decision())
    client.set_client_enabled(True)
    assert client.record(decision())
    assert client.flush_to_spool(10)
    assert client.spool is not None and len(client.spool) == 1
    client.set_client_enabled(False)
    assert not client.record(decision())
    client.shutdown(1)


@pytest.mark.parametrize(
    ("level", "has_text"),
    [pytest.param("metrics", False, id="metrics"), pytest.param("full", True, id="full")],
)
def test_text_only_at_full(tmp_path: Path, level: str, has_text: bool) -> None:
    client = TelemetryClient(settings(level=level), tmp_path)
    client.start()
    client.record(decision(prompt="def secret():", suggestion="return 42"))
    assert client.flush_to_spool(10)
    assert client.spool is not None
    (spooled,) = client.spool.peek(1)
    assert (b"def secret" in spooled.body) is has_text
    assert (b"return 42" in spooled.body) is has_text
    client.shutdown(1)


def test_queue_overflow_is_counted_as_dropped(tmp_path: Path) -> None:
    client = TelemetryClient(settings(queue_max_events=5), tmp_path)
    results = [client.record(OutcomeEvent(decision_id="d", kind="ignored")) for _ in range(8)]
    assert results == [True] * 5 + [False] * 3
    client.start()
    assert client.flush_to_spool(10)
    assert client.spool is not None
    stats = client.spool.stats()
    assert (stats.events, stats.dropped_events) == (5, 3)
    client.shutdown(1)


def test_install_id_is_made_once(tmp_path: Path) -> None:
    first = install_id(tmp_path)
    assert len(first) == 32
    assert install_id(tmp_path) == first
    (tmp_path / "install_id").write_text("")
    assert install_id(tmp_path) != first


def test_turning_telemetry_off_stops_sending_what_is_spooled(
    tmp_path: Path, sqlite_backend: BackendServer
) -> None:
    client = TelemetryClient(settings(sqlite_backend, flush_interval_s=60), tmp_path)
    client.start()
    events = [OutcomeEvent(decision_id=f"d{i}", kind="ignored") for i in range(5)]
    for event in events:
        client.record(event)
    assert client.flush_to_spool(10)
    client.set_client_enabled(False)
    assert client.sender is not None
    one_round(client.sender)
    assert sqlite_backend.bodies == []
    client.set_level("metrics")  # still off: the editor's switch wins
    client.set_client_enabled(True)
    wait_for(lambda: len(sqlite_backend.stored_ids()) == 5)
    assert client.shutdown(5)
