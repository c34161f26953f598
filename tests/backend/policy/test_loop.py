"""Training runs on stores holding data that ingestion refuses today (events stored earlier)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from backend.db.models import StoredEvent
from backend.policy.loop import run_training
from backend.policy.models import PolicyVersionRow
from backend.policy.settings import TrainerSettings
from backend.storage import Storage
from completion.gate import builtin_policy
from telemetry.events import DecisionEvent, OutcomeEvent, parse_event
from tests.backend.policy.synthetic import Logger, contexts, to_events

FAST = TrainerSettings(min_events=100, steps=20, canary_share=0.0)
Body = dict[str, Any]


@pytest.fixture
def storage(db_url: str) -> Iterator[Storage]:
    store = Storage(db_url)
    yield store
    store.close()


def _strict_json(text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} in stored JSON")

    return json.loads(text, parse_constant=refuse)


def _assert_stored_json_is_finite(storage: Storage, tenant: int) -> None:
    with storage.session() as session:
        rows = session.scalars(
            select(PolicyVersionRow).where(PolicyVersionRow.tenant_id == tenant)
        ).all()
        assert rows
        for row in rows:
            _strict_json(row.artifact)
            _strict_json(json.dumps(row.report))  # the report as the database gave it back


def _corrupt_first_decision(storage: Storage, tenant: int, change: Callable[[Body], Body]) -> None:
    """Rewrite a stored decision's body in place, as an event stored before a rule was added."""
    with storage.session() as session:
        row = session.scalars(
            select(StoredEvent)
            .where(StoredEvent.tenant_id == tenant, StoredEvent.type == "decision")
            .order_by(StoredEvent.id)
            .limit(1)
        ).one()
        row.body = change(dict(row.body))
        session.commit()


def _naive(body: Body) -> Body:
    return {**body, "time": datetime.fromisoformat(body["time"]).replace(tzinfo=None).isoformat()}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        pytest.param(_naive, "decision time: Input should have timezone", id="naive-time"),
        pytest.param(lambda b: {**b, "propensity": 0.0}, "propensity", id="propensity-zero"),
        pytest.param(lambda b: {**b, "suggestion_chars": 10**30}, "chars", id="chars-1e30"),
        pytest.param(
            lambda b: {**b, "features": {**b["features"], "prefix_len": 1e308}},
            "features",
            id="feature-1e308",
        ),
        pytest.param(
            lambda b: {**b, "time": "9999-12-31T23:59:59+00:00"}, "in the future", id="year-9999"
        ),
    ],
)
def test_a_bad_stored_event_is_skipped_and_reported(
    storage: Storage, change: Callable[[Body], Body], reason: str
) -> None:
    tenant = storage.ensure_tenant(f"acme-{uuid.uuid4().hex[:8]}")  # PostgreSQL is shared
    start = datetime.now(UTC) - timedelta(hours=1)
    logged = Logger(builtin_policy(), seed=4).log(contexts(300, seed=3), start=start)
    storage.insert_events(tenant, [parse_event(e) for e in to_events(logged)])
    _corrupt_first_decision(storage, tenant, change)

    summary = run_training(storage, tenant, FAST)

    assert summary.events == len(logged) - 1
    assert summary.candidate == "v1"
    ((skipped, count),) = summary.report["skipped_events"].items()
    assert reason in skipped and count == 1
    _assert_stored_json_is_finite(storage, tenant)


def _ignored_shows(n: int, *, start: datetime) -> list[DecisionEvent | OutcomeEvent]:
    """Shown decisions, every one ignored, from a client that sends no gate features."""
    events: list[DecisionEvent | OutcomeEvent] = []
    for i in range(n):
        decision_id = uuid.uuid4().hex
        time = start + timedelta(seconds=i)
        events.append(
            DecisionEvent(
                decision_id=decision_id,
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
                time=time,
            )
        )
        events.append(OutcomeEvent(decision_id=decision_id, kind="ignored", time=time))
    return events


@pytest.mark.parametrize(
    ("decisions", "settings"),
    [
        pytest.param(300, FAST, id="all-ignored"),
        pytest.param(
            20,
            FAST.model_copy(update={"min_events": 10, "holdout_fraction": 0.05}),
            id="one-held-out",
        ),
    ],
)
def test_a_tenant_without_signal_gets_a_finite_not_enough_signal_report(
    storage: Storage, decisions: int, settings: TrainerSettings
) -> None:
    tenant = storage.ensure_tenant(f"acme-{uuid.uuid4().hex[:8]}")  # PostgreSQL is shared
    storage.insert_events(
        tenant, _ignored_shows(decisions, start=datetime.now(UTC) - timedelta(hours=1))
    )

    summary = run_training(storage, tenant, settings)

    assert summary.events == decisions and not summary.promoted
    assert summary.report["enough_signal"] is False
    assert summary.report["reasons"][0].startswith("not enough signal")
    _strict_json(json.dumps(summary.as_json(), allow_nan=False))
    _assert_stored_json_is_finite(storage, tenant)
