"""The backend's FastAPI application.

`create_app(settings)` builds the app's services once from the backend's settings
(`BackendSettings`, `backend/settings.py`) into `BackendServices`: storage, limits, rate limiter,
metrics, policy registry, completion model, index sync store, and the scheduled trainer when
this process trains; it includes the routers, and gives the app one lifespan that starts and stops
those services. Routes ask for a service by type through `backend/deps.py`; a new area adds a
router module under `backend/routes/` (and its logic under `backend/services/`) and includes it
here.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from starlette.concurrency import run_in_threadpool

from backend.routes import (
    completions,
    dashboard,
    events,
    health,
    index_sync,
    model,
    policy,
    stats,
)
from backend.services.completions import RunnerLoader
from backend.services.container import BackendServices
from backend.settings import BackendSettings
from backend.storage import Storage

log = logging.getLogger(__name__)


def _version() -> str:
    try:
        return version("tabloop")
    except PackageNotFoundError:
        return "0+unknown"


class BackendApp(FastAPI):
    """The backend's app: FastAPI, holding the services its routes are given."""

    def __init__(self, services: BackendServices, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.services = services


@asynccontextmanager
async def lifespan(app: BackendApp) -> AsyncIterator[None]:
    """Start the app's services, serve, then stop them (the trainer first finishes the tenant it
    is training, promotion included, and trains no other)."""
    services = app.services
    services.start()
    try:
        yield
    finally:
        # Joining the trainer's thread blocks: off the event loop.
        await run_in_threadpool(services.stop)


def create_app(
    settings: BackendSettings | None = None,
    *,
    storage: Storage | None = None,
    runner_loader: RunnerLoader | None = None,
) -> BackendApp:
    """The backend app that `settings` describe (default: `BackendSettings()`, the defaults and
    the `TABLOOP_BACKEND_*` environment), on `settings.db_url` (migrated on creation unless
    `settings.migrate` is false; closed when the app stops), or on an open `storage` (left
    open). `runner_loader` replaces how the completion model is loaded (tests).
    """
    settings = settings if settings is not None else BackendSettings()
    owned = storage is None
    services = BackendServices.create(
        settings,
        storage
        if storage is not None
        else Storage(settings.db_url, migrate=settings.migrate, pg_ingest=settings.pg_ingest),
        owns_storage=owned,
        runner_loader=runner_loader,
    )
    app = BackendApp(services, title="tabloop backend", version=_version(), lifespan=lifespan)

    @app.exception_handler(DBAPIError)
    async def database_unavailable(_request: Request, exc: DBAPIError) -> JSONResponse:
        # Transient by nature (locked, restarting, connection lost): ask the client to retry.
        log.warning("database error: %s", exc.orig if exc.orig is not None else exc)
        return JSONResponse(
            {"detail": "database unavailable"}, status_code=503, headers={"Retry-After": "1"}
        )

    for module in (health, events, policy, model, index_sync, completions, stats, dashboard):
        app.include_router(module.router)
    return app
