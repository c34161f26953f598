"""`GET /healthz` and `GET /metrics`."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from sqlalchemy import text

from backend.deps import MetricsDep, StorageDep

router = APIRouter()


@router.get("/healthz")
def healthz(storage: StorageDep) -> dict[str, str]:
    """Alive and the database answers (503 otherwise, through the app's database handler)."""
    with storage.engine.connect() as connection:
        connection.execute(text("SELECT 1"))
    return {"status": "ok", "database": storage.dialect}


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(counters: MetricsDep) -> PlainTextResponse:
    """Counters in the Prometheus text format."""
    return PlainTextResponse(
        counters.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
    )
