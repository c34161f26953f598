"""`POST /v1/events`: validated, bounded, rate-limited, idempotent ingestion.

The body is `{"events": [...]}`, optionally gzipped. It is read and decompressed incrementally
against `max_body_bytes`, so a gzip bomb is refused with 413 after at most that many bytes. Each
event is validated on its own: the answer lists which were stored now (`accepted`), which were
stored before (`duplicate`) and which were refused and why (`rejected`, by index).
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.concurrency import run_in_threadpool

from backend.auth import CurrentPrincipal
from backend.metrics import Metrics
from backend.ratelimit import RateLimiter
from backend.storage import AnyEvent, Principal, Storage
from telemetry.events import Event, IngestResponse, Rejection, parse_event

router = APIRouter()


@dataclass(frozen=True)
class IngestLimits:
    """Bounds on what one request may carry, and how fast a tenant may send."""

    max_body_bytes: int = 8 * 1024 * 1024  # after decompression
    max_batch_events: int = 1000
    max_event_bytes: int = 128 * 1024
    rate_events_per_s: float = 2000.0
    burst_events: float = 20000.0


def _refuse(request: Request, code: int, reason: str, detail: str) -> HTTPException:
    metrics: Metrics = request.app.state.metrics
    metrics.inc("tabloop_events_rejected_total", reason=reason)
    metrics.inc("tabloop_ingest_requests_total", status=str(code))
    return HTTPException(code, detail=detail)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, decompressed when gzipped, refused with 413 beyond `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _refuse(request, 413, "body_too_large", f"body over {limit} bytes")
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", "gzip"):
        raise _refuse(request, 415, "encoding", f"unsupported Content-Encoding {encoding!r}")
    inflater = zlib.decompressobj(wbits=31) if encoding == "gzip" else None
    out = bytearray()
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        if received > limit:
            raise _refuse(request, 413, "body_too_large", f"body over {limit} bytes")
        if inflater is None:
            out += chunk
            continue
        try:
            # Never more output than the cap allows: a bomb stops here, not in memory.
            out += inflater.decompress(chunk, limit + 1 - len(out))
        except zlib.error as exc:
            raise _refuse(request, 400, "malformed", f"bad gzip data: {exc}") from exc
        if len(out) > limit or inflater.unconsumed_tail:
            raise _refuse(request, 413, "body_too_large", f"body over {limit} bytes inflated")
    if inflater is not None and (not inflater.eof or inflater.unused_data):
        raise _refuse(request, 400, "malformed", "truncated or trailing gzip data")
    return bytes(out)


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


@router.post("/v1/events")
async def ingest_events(request: Request, principal: CurrentPrincipal) -> JSONResponse:
    """Store a batch of telemetry events for the token's tenant."""
    limits: IngestLimits = request.app.state.limits
    metrics: Metrics = request.app.state.metrics
    body = await read_body(request, limits.max_body_bytes)
    storage: Storage = request.app.state.storage
    result = await run_in_threadpool(
        ingest_body, storage, principal, body, limits, request.app.state.rate_limiter
    )
    if isinstance(result, Refusal):
        metrics.inc("tabloop_events_rejected_total", max(1, result.events), reason=result.reason)
        metrics.inc("tabloop_ingest_requests_total", status=str(result.status))
        headers = {"Retry-After": str(result.retry_after)} if result.retry_after else None
        return JSONResponse({"detail": result.detail}, status_code=result.status, headers=headers)
    answer = result.answer
    for kind, count in result.stored_by_type.items():
        metrics.inc("tabloop_events_ingested_total", count, type=kind)
    if answer.duplicate:
        metrics.inc("tabloop_events_duplicate_total", len(answer.duplicate))
    if answer.rejected:
        metrics.inc("tabloop_events_rejected_total", len(answer.rejected), reason="invalid")
    metrics.inc("tabloop_ingest_requests_total", status="200")
    return JSONResponse(answer.model_dump())
