"""Logged decisions of a tenant, read from the event store and joined into rewards."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime

from pydantic import ValidationError
from sqlalchemy import func, select

from backend.db.models import StoredEvent
from backend.policy.rewards import LoggedDecision, join_rewards
from backend.policy.settings import RewardSettings
from backend.storage import Storage
from telemetry.events import DecisionEvent, OutcomeEvent, RetentionEvent, parse_event

ID_CHUNK = 500  # decision ids per IN (...) query: well under every database's limit


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def latest_event_id(storage: Storage, tenant_id: int) -> int:
    """Row id of the tenant's newest event (0 when none): tells whether anything is new."""
    with storage.session() as session:
        return int(
            session.scalar(
                select(func.max(StoredEvent.id)).where(StoredEvent.tenant_id == tenant_id)
            )
            or 0
        )


def load_logged(
    storage: Storage,
    tenant_id: int,
    *,
    window: int,
    now: datetime,
    settings: RewardSettings,
) -> list[LoggedDecision]:
    """The tenant's newest `window` decisions with their rewards, oldest first."""
    with storage.session() as session:
        bodies = session.scalars(
            select(StoredEvent.body)
            .where(StoredEvent.tenant_id == tenant_id, StoredEvent.type == "decision")
            .order_by(StoredEvent.id.desc())
            .limit(window)
        ).all()
        decisions = [event for event in map(_parse, bodies) if isinstance(event, DecisionEvent)]
        ids = [d.decision_id for d in decisions]
        outcomes: list[OutcomeEvent] = []
        retentions: list[RetentionEvent] = []
        for chunk in _chunks(ids, ID_CHUNK):
            rows = session.scalars(
                select(StoredEvent.body).where(
                    StoredEvent.tenant_id == tenant_id,
                    StoredEvent.decision_id.in_(chunk),
                    StoredEvent.type.in_(("outcome", "retention")),
                )
            ).all()
            for event in map(_parse, rows):
                if isinstance(event, OutcomeEvent):
                    outcomes.append(event)
                elif isinstance(event, RetentionEvent):
                    retentions.append(event)
    return join_rewards(decisions, outcomes, retentions, now=now, settings=settings)


def _parse(body: object) -> DecisionEvent | OutcomeEvent | RetentionEvent | None:
    # Stored bodies were validated on ingestion; one that no longer parses (an older schema)
    # is skipped rather than stopping training.
    try:
        return parse_event(body)
    except ValidationError:
        return None
