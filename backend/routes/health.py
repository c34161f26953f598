"""`GET /healthz` and `GET /metrics`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from sqlalchemy import text

from backend.metrics import Metrics
from backend.storage import Storage

router = APIRouter()


@router.get("/healthz")
def healthz(request: Request) -> dict[str, str]:
    """Alive and the database answers (503 otherwise, through the app's database handler)."""
    storage: Storage = request.app.state.storage
    with storage.engine.connect() as connection:
        connection.execute(text("SELECT 1"))
    return {"status": "ok", "database": storage.dialect}


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(request: Request) -> PlainTextResponse:
    """Counters in the Prometheus text format."""
    registry: Metrics = request.app.state.metrics
    return PlainTextResponse(
        registry.render(), media_type="text/plain; version=0.0.4; charset=utf-8"
    )
