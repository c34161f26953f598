"""The backend's FastAPI application.

`create_app()` wires storage, limits, metrics and the routers; areas of the backend add their own
router module under `backend/routes/` and include it here. Shared state lives on `app.state`:
`storage` (`Storage`), `limits` (`IngestLimits`), `rate_limiter` (`RateLimiter`), `metrics`
(`Metrics`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError

from backend.metrics import Metrics
from backend.ratelimit import RateLimiter
from backend.routes import completions, events, health, index_sync, policy
from backend.routes.events import IngestLimits
from backend.storage import Storage, default_db_url

log = logging.getLogger(__name__)


def _version() -> str:
    try:
        return version("tabloop")
    except PackageNotFoundError:
        return "0+unknown"


def create_app(
    db_url: str | None = None,
    *,
    storage: Storage | None = None,
    limits: IngestLimits | None = None,
) -> FastAPI:
    """The backend app on `db_url` (migrated on creation), or on an open `storage`."""
    owned = storage is None
    store = storage if storage is not None else Storage(db_url or default_db_url())
    limits = limits or IngestLimits()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        if owned:
            store.close()

    app = FastAPI(title="tabloop backend", version=_version(), lifespan=lifespan)
    app.state.storage = store
    app.state.limits = limits
    app.state.metrics = Metrics()
    app.state.rate_limiter = RateLimiter(
        limits.rate_events_per_s, max(limits.burst_events, limits.max_batch_events)
    )

    @app.exception_handler(DBAPIError)
    async def database_unavailable(_request: Request, exc: DBAPIError) -> JSONResponse:
        # Transient by nature (locked, restarting, connection lost): ask the client to retry.
        log.warning("database error: %s", exc.orig if exc.orig is not None else exc)
        return JSONResponse(
            {"detail": "database unavailable"}, status_code=503, headers={"Retry-After": "1"}
        )

    app.include_router(health.router)
    app.include_router(events.router)
    policy.install(app)
    index_sync.install(app)
    completions.install(app)
    return app
