"""Group commit: concurrent inserts share transactions without mixing up their answers."""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy.exc import DBAPIError

from backend.storage import Storage
from telemetry.events import OutcomeEvent

THREADS = 8
EVENTS_PER_THREAD = 60


def test_concurrent_overlapping_inserts_store_each_event_once(db_url: str) -> None:
    storage = Storage(db_url)
    tenant = storage.ensure_tenant(f"group-{uuid.uuid4().hex[:8]}")
    shared = [OutcomeEvent(decision_id=f"s{i}", kind="ignored") for i in range(20)]
    own = [
        [OutcomeEvent(decision_id=f"t{t}-{i}", kind="ignored") for i in range(EVENTS_PER_THREAD)]
        for t in range(THREADS)
    ]
    answers: list[set[str]] = [set() for _ in range(THREADS)]
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            # Every thread also sends the shared events: exactly one of them may store each.
            for start in range(0, EVENTS_PER_THREAD, 20):
                batch = own[t][start : start + 20] + shared
                answers[t] |= storage.insert_events(tenant, batch)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    try:
        assert errors == []
        for t in range(THREADS):
            assert {str(e.event_id) for e in own[t]} <= answers[t]
        shared_ids = {str(e.event_id) for e in shared}
        winners = [answers[t] & shared_ids for t in range(THREADS)]
        assert sum(len(w) for w in winners) == len(shared_ids)  # each stored by exactly one
        assert set().union(*winners) == shared_ids
        stored = storage.event_ids(tenant)
        assert len(stored) == len(set(stored)) == THREADS * EVENTS_PER_THREAD + len(shared)
    finally:
        storage.close()


def test_a_failed_transaction_fails_its_callers_and_not_the_next(db_url: str) -> None:
    storage = Storage(db_url)
    try:
        missing_tenant = 10**9  # violates the foreign key
        with pytest.raises(DBAPIError):
            storage.insert_events(missing_tenant, [OutcomeEvent(decision_id="x", kind="ignored")])
        tenant = storage.ensure_tenant(f"group-{uuid.uuid4().hex[:8]}")
        event = OutcomeEvent(decision_id="y", kind="ignored")
        assert storage.insert_events(tenant, [event]) == {str(event.event_id)}
    finally:
        storage.close()
