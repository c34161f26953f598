"""`POST /v1/events`: validated, bounded, rate-limited, idempotent ingestion.

The body is `{"events": [...]}`, optionally gzipped. It is read and decompressed incrementally
against `max_body_bytes`, so a gzip bomb is refused with 413 after at most that many bytes. Each
event is validated on its own (`backend/services/ingest.py`): the answer lists which were stored
now (`accepted`), which were stored before (`duplicate`) and which were refused and why
(`rejected`, by index).
"""

from __future__ import annotations

import zlib

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from backend.auth import CurrentPrincipal
from backend.deps import IngestLimitsDep, MetricsDep, RateLimiterDep, StorageDep, services_of
from backend.services.ingest import Refusal, ingest_body

router = APIRouter()


def _refuse(request: Request, code: int, reason: str, detail: str) -> HTTPException:
    # read_body serves other routes too, whose signatures do not carry the metrics.
    metrics = services_of(request).metrics
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


@router.post("/v1/events")
async def ingest_events(
    request: Request,
    principal: CurrentPrincipal,
    storage: StorageDep,
    limits: IngestLimitsDep,
    limiter: RateLimiterDep,
    metrics: MetricsDep,
) -> JSONResponse:
    """Store a batch of telemetry events for the token's tenant."""
    body = await read_body(request, limits.max_body_bytes)
    result = await run_in_threadpool(ingest_body, storage, principal, body, limits, limiter)
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
