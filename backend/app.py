"""The backend's FastAPI application.

`create_app()` builds the app's services once (`BackendServices`: storage, limits, rate limiter,
metrics, policy registry, completion model, index sync store, and the scheduled trainer when
this process trains), includes the routers, and gives the app one lifespan that starts and stops
those services. Routes ask for a service by type through `backend/deps.py`; a new area adds a
router module under `backend/routes/` (and its logic under `backend/services/`) and includes it
here.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError
from starlette.concurrency import run_in_threadpool

from backend.adapters.scheduler import AdapterSchedule
from backend.policy.settings import TrainerSettings
from backend.ratelimit import RequestRateSettings
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
from backend.services.bodies import BodyLimits
from backend.services.completions import RunnerLoader
from backend.services.container import BackendServices
from backend.services.ingest import IngestLimits
from backend.storage import Storage, default_db_url
from common.config import configured_cache_dir
from completion.settings import CompletionSettings

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
    db_url: str | None = None,
    *,
    migrate: bool = True,
    storage: Storage | None = None,
    limits: IngestLimits | None = None,
    bodies: BodyLimits | None = None,
    metrics_tenant_labels: bool = False,
    trainer: TrainerSettings | None = None,
    train: bool = False,
    completion: CompletionSettings | None = None,
    preload_model: bool = False,
    cache_dir: Path | None = None,
    runner_loader: RunnerLoader | None = None,
    failover_s: float | None = None,
    shared_rate_limits: bool = False,
    pg_ingest: str = "array",
    adapters: AdapterSchedule | None = None,
    request_rates: RequestRateSettings | None = None,
) -> BackendApp:
    """The backend app on `db_url` (migrated on creation unless `migrate` is false; closed when
    the app stops), or on an open `storage` (left open).

    `trainer` sets the policy loop (default settings otherwise); with `train` this process runs
    the scheduled trainer while serving. `completion` chooses the model of `/v1/completions`
    (default: the bundled one, loaded on first use; `preload_model` starts loading it at start;
    `cache_dir` and `runner_loader` replace where and how it is loaded; the cache directory
    defaults to the configured one, as every command finds it). `bodies` bounds JSON
    request bodies (depth, read timeout); with `metrics_tenant_labels` the per-tenant counters of
    `/metrics` carry a `tenant` label (off by default: the endpoint is open).

    On PostgreSQL, `failover_s` makes `train` stand in the trainer election (several instances
    on one database), `shared_rate_limits` keeps rate limits in the database, and `pg_ingest`
    chooses how events are inserted (`backend.storage.PG_INGEST_PATHS`).

    `adapters` schedules the tenants' adapter training in the process that trains (off unless
    its `every_s` is set). `request_rates` sets the per-tenant request rates of the statistics
    and registry-action routes.
    """
    owned = storage is None
    services = BackendServices.create(
        storage
        if storage is not None
        else Storage(db_url or default_db_url(), migrate=migrate, pg_ingest=pg_ingest),
        owns_storage=owned,
        limits=limits,
        bodies=bodies,
        metrics_tenant_labels=metrics_tenant_labels,
        trainer=trainer,
        train=train,
        completion=completion,
        preload_model=preload_model,
        # `cacheDir` from config.toml or the workspace, or $TABLOOP_CACHE_DIR: where every other
        # command keeps the model's weights (common.config).
        cache_dir=cache_dir if cache_dir is not None else configured_cache_dir(),
        runner_loader=runner_loader,
        failover_s=failover_s,
        shared_rate_limits=shared_rate_limits,
        adapters=adapters,
        request_rates=request_rates,
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
