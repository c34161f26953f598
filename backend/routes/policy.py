"""`GET /v1/policy`: the tenant's serving policy, with an entity tag; and the trainer schedule.

Clients poll with `If-None-Match`; an unchanged policy costs a 304 and no body. With nothing
promoted yet the built-in policy is served, so a rollback to it reaches every client too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request, Response
from starlette.concurrency import run_in_threadpool

from backend.auth import CurrentPrincipal
from backend.policy.loop import TrainingScheduler
from backend.policy.registry import PolicyRegistry
from backend.policy.settings import TrainerSettings
from backend.storage import Storage

router = APIRouter()

POLICY_VERSION_HEADER = "X-Tabloop-Policy-Version"


def _registry(request: Request) -> PolicyRegistry:
    registry: PolicyRegistry | None = getattr(request.app.state, "policy_registry", None)
    if registry is None:
        registry = PolicyRegistry(request.app.state.storage)
        request.app.state.policy_registry = registry
    return registry


def _matches(if_none_match: str | None, etag: str) -> bool:
    if not if_none_match:
        return False
    tags = {tag.strip().removeprefix("W/") for tag in if_none_match.split(",")}
    return "*" in tags or etag in tags


@router.get("/v1/policy")
def get_policy(principal: CurrentPrincipal, request: Request) -> Response:
    """The serving policy artefact of the caller's tenant (304 when the client has it)."""
    served = _registry(request).serving_artifact(principal.tenant_id)
    headers = {
        "ETag": served.etag,
        "Cache-Control": "no-cache",
        POLICY_VERSION_HEADER: served.version,
    }
    if _matches(request.headers.get("if-none-match"), served.etag):
        return Response(status_code=304, headers=headers)
    return Response(served.artifact, media_type="application/json", headers=headers)


@router.get("/v1/policy/versions")
def list_versions(principal: CurrentPrincipal, request: Request) -> dict[str, Any]:
    """Every policy version of the tenant, and the promotion history."""
    registry = _registry(request)
    return {
        "serving": registry.serving_version(principal.tenant_id),
        "versions": [r.as_json() for r in registry.versions(principal.tenant_id)],
        "history": registry.history(principal.tenant_id),
    }


def install(app: FastAPI) -> None:
    """Add the policy routes to `app` (a registry on `app.state` serves them)."""
    app.include_router(router)
    app.state.policy_registry = PolicyRegistry(app.state.storage)


def schedule_training(app: FastAPI, settings: TrainerSettings | None = None) -> TrainingScheduler:
    """Train in the background while `app` runs: the scheduler starts and stops with the app's
    lifespan (wrapped around the existing one)."""
    trainer_settings = settings or TrainerSettings.model_validate({})
    storage: Storage = app.state.storage
    app.state.policy_registry = PolicyRegistry(storage, builtin_floor=trainer_settings.show_floor)
    scheduler = TrainingScheduler(storage, trainer_settings)
    app.state.trainer = scheduler
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: FastAPI) -> AsyncIterator[Any]:
        scheduler.start()
        try:
            async with inner(a) as state:
                yield state
        finally:
            await run_in_threadpool(scheduler.stop)

    app.router.lifespan_context = lifespan
    return scheduler
