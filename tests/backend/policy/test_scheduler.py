"""Stopping the scheduled trainer: it ends after the tenant in progress, never in the middle of
one, and starts again; the backend keeps the storage open for a trainer that outlives its stop."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from backend.policy import loop
from backend.policy.loop import RunSummary, TrainingScheduler
from backend.policy.settings import TrainerSettings
from backend.services.container import BackendServices
from backend.settings import BackendSettings
from backend.storage import Storage
from telemetry.events import DecisionEvent

TRAINER_THREAD = "tabloop-trainer"
SETTINGS = TrainerSettings.model_validate(
    {"interval_s": 3600, "canary_share": 0.0}
)  # runs only when triggered


@pytest.fixture
def storage(db_url: str) -> Iterator[Storage]:
    store = Storage(db_url)
    yield store
    store.close()


def _tenants_with_events(storage: Storage, count: int) -> list[int]:
    """`count` new tenants (PostgreSQL is shared across the session), one event each."""
    tenants = []
    for _ in range(count):
        tenant = storage.ensure_tenant(f"sched-{uuid.uuid4().hex[:8]}")
        event = DecisionEvent(
            decision_id=uuid.uuid4().hex,
            session_id="s",
            install_id="i",
            language="python",
            trigger="automatic",
            policy_version="builtin",
            model_id="m",
            action="show",
            propensity=0.8,
            features={"prefix_len": 12.0},
            suggestion_chars=10,
            time=datetime.now(UTC),
        )
        storage.insert_events(tenant, [event])
        tenants.append(tenant)
    return tenants


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _trainer_running() -> bool:
    return any(thread.name == TRAINER_THREAD for thread in threading.enumerate())


class FakeTraining:
    """Stands in for `run_training`: records each tenant's steps; the first of `slow` waits
    in the middle of its run (between storing and promoting) until `release` says so."""

    def __init__(self, ours: list[int], release: Callable[[], bool]) -> None:
        self.ours = ours
        self.release = release
        self.slow = ours[0]
        self.steps: list[tuple[str, int]] = []
        self.entered = threading.Event()

    def __call__(self, storage: Storage, tenant_id: int, settings: Any, **_: Any) -> RunSummary:
        now = time.time()
        if tenant_id in self.ours:
            self.steps.append(("add", tenant_id))
            if tenant_id == self.slow:
                self.slow = -1  # slow once
                self.entered.set()
                _wait_for(self.release, "the test to release the run")
            self.steps.append(("promote", tenant_id))
        return RunSummary(tenant_id, now, time.time(), 1, "builtin", promoted=True)


def _whole_run(tenant: int) -> list[tuple[str, int]]:
    return [("add", tenant), ("promote", tenant)]


def _trained(scheduler: TrainingScheduler, ours: list[int]) -> list[int]:
    return [run.tenant_id for run in scheduler.runs if run.tenant_id in ours]


def test_a_stopped_scheduler_finishes_its_tenant_then_stops_and_starts_again(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second, third = ours = _tenants_with_events(storage, 3)
    scheduler = TrainingScheduler(storage, SETTINGS)
    fake = FakeTraining(ours, release=lambda: scheduler.stopping)
    monkeypatch.setattr(loop, "run_training", fake)

    scheduler.start()
    scheduler.trigger()
    assert fake.entered.wait(10)  # the first tenant is half-way when the app stops
    assert scheduler.stop(timeout=10) is True

    assert not _trainer_running()
    # Its run was finished, promotion included; the other tenants were left for later.
    assert fake.steps == _whole_run(first)
    assert _trained(scheduler, ours) == [first]

    scheduler.start()  # stopped once, the scheduler trains again when started
    assert not scheduler.stopping
    scheduler.trigger()
    _wait_for(lambda: _trained(scheduler, ours) == ours, "the other tenants' runs")
    assert scheduler.stop() is True
    assert fake.steps[2:] == [step for tenant in (second, third) for step in _whole_run(tenant)]


def test_a_trainer_outliving_its_stop_ends_after_its_tenant(
    storage: Storage, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours = _tenants_with_events(storage, 2)
    release = threading.Event()
    scheduler = TrainingScheduler(storage, SETTINGS)
    fake = FakeTraining(ours, release=release.is_set)
    monkeypatch.setattr(loop, "run_training", fake)

    scheduler.start()
    scheduler.trigger()
    assert fake.entered.wait(10)
    assert scheduler.stop(timeout=0.05) is False  # still training: the caller must wait
    assert _trainer_running()

    release.set()
    _wait_for(lambda: not _trainer_running(), "the trainer thread to end")
    assert fake.steps == _whole_run(ours[0])  # and the second tenant waits for a start


def test_the_backend_leaves_the_storage_open_for_a_trainer_still_running(
    storage: Storage, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    services = BackendServices.create(
        BackendSettings(train=True, cache_dir=tmp_path), storage, owns_storage=True
    )
    assert services.trainer is not None
    monkeypatch.setattr(services.trainer, "stop", lambda: False)  # the join timed out
    closed: list[bool] = []
    monkeypatch.setattr(storage, "close", lambda: closed.append(True))

    services.stop()

    assert closed == []
