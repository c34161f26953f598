"""Logged decisions of a tenant, read from the event store and joined into rewards.

Every stored body is validated again with the current schema: events stored before a rule was
added (a naive time, a propensity of 0, an unbounded count) would otherwise reach the trainer's
arithmetic. Such an event is skipped and counted by reason, so one bad event costs itself, not
the tenant's training run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pydantic import ValidationError
from sqlalchemy import func, select

from backend.db.models import StoredEvent
from backend.policy.rewards import LoggedDecision, as_utc, join_rewards
from backend.policy.settings import RewardSettings
from backend.storage import Storage
from telemetry.events import AnyEvent, DecisionEvent, OutcomeEvent, RetentionEvent, parse_event

ID_CHUNK = 500  # decision ids per IN (...) query: well under every database's limit
# A decision newer than this ahead of the trainer's clock is skipped: a broken client clock (or an
# event stored before ingestion bounded times) would otherwise always sit in the holdout.
FUTURE_SLACK = timedelta(days=1)
Parsed = AnyEvent


@dataclass
class LoggedData:
    """A tenant's rewarded decisions, and the stored events left out for being invalid."""

    decisions: list[LoggedDecision]
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> events


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


def event_time(storage: Storage, tenant_id: int, event_id: int) -> float | None:
    """When the tenant's event row `event_id` happened (seconds since the epoch), or None."""
    with storage.session() as session:
        when = session.scalar(
            select(StoredEvent.time).where(
                StoredEvent.tenant_id == tenant_id, StoredEvent.id == event_id
            )
        )
    return as_utc(when).timestamp() if when is not None else None


def load_logged(
    storage: Storage,
    tenant_id: int,
    *,
    window: int,
    now: datetime,
    settings: RewardSettings,
) -> LoggedData:
    """The tenant's newest `window` decisions with their rewards, oldest first."""
    skipped: Counter[str] = Counter()
    latest = as_utc(now) + FUTURE_SLACK
    with storage.session() as session:
        bodies = session.scalars(
            select(StoredEvent.body)
            .where(StoredEvent.tenant_id == tenant_id, StoredEvent.type == "decision")
            .order_by(StoredEvent.id.desc())
            .limit(window)
        ).all()
        decisions: list[DecisionEvent] = []
        for event in _parse_all(bodies, skipped):
            if not isinstance(event, DecisionEvent):
                continue
            if event.time > latest:
                skipped["decision time: in the future"] += 1
                continue
            decisions.append(event)
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
            for event in _parse_all(rows, skipped):
                if isinstance(event, OutcomeEvent):
                    outcomes.append(event)
                elif isinstance(event, RetentionEvent):
                    retentions.append(event)
    logged = join_rewards(decisions, outcomes, retentions, now=now, settings=settings)
    return LoggedData(logged, skipped)


def _parse_all(bodies: Sequence[object], skipped: Counter[str]) -> Iterator[Parsed]:
    """The bodies that the current schema accepts; the others counted in `skipped`."""
    for body in bodies:
        try:
            yield parse_event(body)
        except ValidationError as exc:
            skipped[_reason(body, exc)] += 1


def _reason(body: object, exc: ValidationError) -> str:
    # Type, field and message, without the value: reasons are counted, so they must repeat.
    kind = body.get("type") if isinstance(body, dict) else None
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"][1:])  # loc[0] is the type tag
    return f"{kind if isinstance(kind, str) else 'event'} {where or 'body'}: {error['msg']}"
