"""Ingestion of telemetry batches: decode, validate, rate-limit and store.

The route (`backend/routes/events.py`) reads the body against the size cap; everything after
that runs here, in a worker thread. Each event is validated on its own, so the answer can say
which were stored now (`accepted`), which were stored before (`duplicate`) and which were
refused and why (`rejected`, by index).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from backend.ratelimit import RateLimiter
from backend.storage import AnyEvent, Principal, Storage
from telemetry.events import Event, IngestResponse, Rejection, parse_event


@dataclass(frozen=True)
class IngestLimits:
    """Bounds on what one request may carry, and how fast a tenant may send."""

    max_body_bytes: int = 8 * 1024 * 1024  # after decompression
    max_batch_events: int = 1000
    max_event_bytes: int = 128 * 1024
    rate_events_per_s: float = 2000.0
    burst_events: float = 20000.0


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else error["msg"]


class EventBatch(BaseModel):
    """The request body when every event in it is valid (the fast path)."""

    model_config = ConfigDict(extra="forbid")

    events: list[Event]


Valid = list[tuple[int, AnyEvent, str, str]]  # index in the batch, event, its id, its JSON


def _sized(
    index: int, event: AnyEvent, limit: int, valid: Valid, rejected: list[Rejection]
) -> None:
    text = event.model_dump_json()  # also what is stored
    event_id = str(event.event_id)  # once: formatting a UUID is not free at 10k events/s
    if len(text) > limit:
        rejected.append(Rejection(index=index, event_id=event_id, error="event too large"))
    else:
        valid.append((index, event, event_id, text))


def validate_batch(items: list[Any], max_event_bytes: int) -> tuple[Valid, list[Rejection]]:
    """Valid events with their index and JSON, and a rejection for every invalid one."""
    valid: Valid = []
    rejected: list[Rejection] = []
    for index, item in enumerate(items):
        try:
            event = parse_event(item)
        except ValidationError as exc:
            raw_id = item.get("event_id") if isinstance(item, dict) else None
            event_id = raw_id if isinstance(raw_id, str) and len(raw_id) <= 64 else None
            rejected.append(Rejection(index=index, event_id=event_id, error=_first_error(exc)))
            continue
        _sized(index, event, max_event_bytes, valid, rejected)
    return valid, rejected


@dataclass(frozen=True)
class Refusal:
    """A batch refused as a whole."""

    status: int
    reason: str
    detail: str
    events: int = 0
    retry_after: int | None = None


@dataclass
class Ingested:
    """A processed batch: the answer, and new events per type for the metrics."""

    answer: IngestResponse
    stored_by_type: dict[str, int]


def ingest_body(
    storage: Storage,
    principal: Principal,
    body: bytes,
    limits: IngestLimits,
    limiter: RateLimiter,
) -> Ingested | Refusal:
    """Decode, validate, rate-limit and store one request body (runs in a worker thread)."""
    items: list[Any] | None = None
    try:
        # Fast path: pydantic parses and validates the whole body in one pass.
        events: list[AnyEvent] = EventBatch.model_validate_json(body).events
        count = len(events)
    except ValidationError:
        # Something is wrong somewhere: decode it ourselves to say which events, or why not.
        try:
            payload = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return Refusal(400, "malformed", f"body is not JSON: {exc}")
        items = payload.get("events") if isinstance(payload, dict) else None
        if not isinstance(items, list) or set(payload) != {"events"}:
            return Refusal(400, "malformed", 'body must be {"events": [...]}')
        count = len(items)
    if count > limits.max_batch_events:
        return Refusal(413, "batch_too_large", f"at most {limits.max_batch_events} events a batch")
    wait = limiter.take(principal.tenant_id, count)
    if wait > 0:
        return Refusal(429, "rate_limited", "rate limit exceeded", count, max(1, math.ceil(wait)))
    if items is None:
        valid: Valid = []
        rejected: list[Rejection] = []
        for index, event in enumerate(events):
            _sized(index, event, limits.max_event_bytes, valid, rejected)
    else:
        valid, rejected = validate_batch(items, limits.max_event_bytes)
    inserted = storage.insert_events(
        principal.tenant_id,
        [event for _, event, _, _ in valid],
        [text for _, _, _, text in valid],
        [event_id for _, _, event_id, _ in valid],
    )
    answer = IngestResponse(rejected=rejected)
    stored_by_type: dict[str, int] = {}
    for _, event, event_id, _ in valid:
        if event_id in inserted:
            answer.accepted.append(event_id)
            stored_by_type[event.type] = stored_by_type.get(event.type, 0) + 1
            inserted.discard(event_id)  # a second copy in the same batch is a duplicate
        else:
            answer.duplicate.append(event_id)
    return Ingested(answer, stored_by_type)
