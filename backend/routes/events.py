"""`POST /v1/events`: validated, bounded, rate-limited, idempotent ingestion.

The body is `{"events": [...]}`, optionally gzipped. It is read and decompressed incrementally
against `max_body_bytes`, so a gzip bomb is refused with 413 after at most that many bytes, and its
nesting is bounded before it is parsed (`backend/routes/body.py`). Each
event is validated on its own (`backend/services/ingest.py`): the answer lists which were stored
now (`accepted`), which were stored before (`duplicate`) and which were refused and why
(`rejected`, by index).
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from backend.auth import CurrentPrincipal
from backend.deps import Services
from backend.routes.body import json_body_openapi, read_body
from backend.services.ingest import EventBatch, Refusal, ingest_body

router = APIRouter()


@router.post("/v1/events", openapi_extra=json_body_openapi(EventBatch))
async def ingest_events(
    request: Request, principal: CurrentPrincipal, services: Services
) -> Response:
    """Store a batch of telemetry events for the token's tenant.

    Every batch is also counted for the dashboard, per tenant and minute: its events and their
    fate, a refusal (a rate-limited request apart), and the sender's spool when it says.
    """
    # The services this route uses are taken from the one container: resolving six providers
    # per request cost a tenth of an instance's CPU at full ingest (profiled). A test still
    # swaps one through `BackendServices`.
    storage, limits, limiter = services.storage, services.limits, services.rate_limiter
    metrics, counts = services.metrics, services.ingest_stats
    # The nesting bound is checked by `ingest_body`, only when the body is not a valid batch:
    # pydantic's parser refuses a depth bomb by itself, and scanning every body cost more
    # CPU than validating it.
    body = await read_body(request, limits.max_body_bytes)
    max_depth = services.bodies.max_depth
    result = await run_in_threadpool(
        ingest_body, storage, principal, body, limits, limiter, max_depth
    )
    tenant = principal.tenant
    if isinstance(result, Refusal):
        metrics.inc(
            "tabloop_events_rejected_total",
            max(1, result.events),
            reason=result.reason,
            tenant=tenant,
        )
        metrics.inc("tabloop_ingest_requests_total", status=str(result.status), tenant=tenant)
        counts.count(
            principal.tenant_id,
            batches=1,
            events=result.events,
            refused_batches=1,
            rate_limited=int(result.status == 429),
        )
        headers = {"Retry-After": str(result.retry_after)} if result.retry_after else None
        return JSONResponse({"detail": result.detail}, status_code=result.status, headers=headers)
    answer = result.answer
    for kind, count in result.stored_by_type.items():
        metrics.inc("tabloop_events_ingested_total", count, type=kind, tenant=tenant)
    if answer.duplicate:
        metrics.inc("tabloop_events_duplicate_total", len(answer.duplicate), tenant=tenant)
    if answer.rejected:
        metrics.inc(
            "tabloop_events_rejected_total", len(answer.rejected), reason="invalid", tenant=tenant
        )
    metrics.inc("tabloop_ingest_requests_total", status="200", tenant=tenant)
    counts.count(
        principal.tenant_id,
        batches=1,
        events=len(answer.accepted) + len(answer.duplicate) + len(answer.rejected),
        accepted=len(answer.accepted),
        duplicate=len(answer.duplicate),
        rejected_events=len(answer.rejected),
        duplicate_batches=int(bool(answer.duplicate) and not answer.accepted),
    )
    if result.meta is not None:
        meta = result.meta
        counts.spool(principal.tenant_id, meta.install_id, meta.spool_backlog, meta.spool_dropped)
    # pydantic writes the JSON itself: no dict of the answer's ids built and encoded again.
    return Response(answer.model_dump_json(), media_type="application/json")
