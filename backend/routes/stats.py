"""`GET /v1/stats/...`: the loop's figures per tenant, for the dashboard and for scripts.

A token reads its own tenant (`?tenant=` may name it, or be left out); an admin token
(`tabloop backend token create --admin`) reads any tenant by name. Another tenant is 403 for a
tenant token whether it exists or not, so a token learns nothing about other tenants; an admin
asking for a tenant that does not exist gets 404. `?window=` is one of 1h, 24h, 7d, 30d.

    /v1/stats/tenants                      the tenants this token may read
    /v1/stats/overview?window=24h          totals, time series, policy bands, markers
    /v1/stats/by/{language|editor|policy}  the same figures split by a dimension
    /v1/stats/policies                     versions, their evaluation and live figures
    /v1/stats/ingestion?window=24h         batches per minute, refusals, spools, index sync

`POST /v1/policy/promote`, `/v1/policy/rollback` (and `/v1/policy/approve` when the registry
has approvals) change the registry as `tabloop policy` does, recording the token's label as who
acted.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query, Request, status
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from backend.auth import NotStored
from backend.deps import IngestStatsDep, RegistryDep, StatsDep, StorageDep
from backend.policy.registry import RegistryError
from backend.routes.body import json_body_openapi, read_json_body
from backend.routes.index_sync import validation_detail
from backend.routes.throttle import PolicyPrincipal, StatsPrincipal
from backend.services.stats import DIMENSIONS, WINDOWS
from backend.storage import Principal, Storage

# Every answer is a tenant's figures or a registry change: nothing here may be cached.
router = APIRouter(dependencies=[NotStored])

WINDOW_PATTERN = "^(" + "|".join(WINDOWS) + ")$"
DIMENSION_PATTERN = "^(" + "|".join(DIMENSIONS) + ")$"


def tenant_for(storage: Storage, principal: Principal, name: str | None) -> tuple[int, str]:
    """`(id, name)` of the tenant a request reads: its own, or any for an admin token."""
    if name is None or name == principal.tenant:
        return principal.tenant_id, principal.tenant
    if not principal.admin:
        raise HTTPException(status.HTTP_403_FORBIDDEN, detail="this token reads its own tenant")
    found = storage.tenant_id(name)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no tenant {name!r}")
    return found, name


Tenant = Query(default=None, max_length=128, description="tenant name (default: the token's)")
Window = Query(default="24h", pattern=WINDOW_PATTERN)


@router.get("/v1/stats/tenants")
def tenants(principal: StatsPrincipal, storage: StorageDep) -> dict[str, Any]:
    """The tenants this token may read, and who it is."""
    names = [name for _, name in storage.tenants()] if principal.admin else [principal.tenant]
    return {
        "tenant": principal.tenant,
        "label": principal.label,
        "admin": principal.admin,
        "tenants": names,
    }


@router.get("/v1/stats/overview")
def overview(
    principal: StatsPrincipal,
    storage: StorageDep,
    stats: StatsDep,
    tenant: str | None = Tenant,
    window: str = Window,
) -> dict[str, Any]:
    """Requests, shown share, accept rates, accepted and retained characters, silences by
    reason and reported latency of a tenant over a window, with the serving policy's bands."""
    tenant_id, name = tenant_for(storage, principal, tenant)
    return {"tenant": name, **stats.overview(tenant_id, window)}


@router.get("/v1/stats/by/{dimension}")
def split(
    dimension: str,
    principal: StatsPrincipal,
    storage: StorageDep,
    stats: StatsDep,
    tenant: str | None = Tenant,
    window: str = Window,
) -> dict[str, Any]:
    """The Overview's figures split by language, editor (client name), policy version or model
    (adapter) version."""
    if dimension not in DIMENSIONS:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, detail=f"split by one of {', '.join(DIMENSIONS)}"
        )
    tenant_id, name = tenant_for(storage, principal, tenant)
    return {"tenant": name, **stats.split(tenant_id, window, dimension)}


@router.get("/v1/stats/policies")
def policies(
    principal: StatsPrincipal,
    storage: StorageDep,
    stats: StatsDep,
    registry: RegistryDep,
    tenant: str | None = Tenant,
) -> dict[str, Any]:
    """Every policy version with its off-policy evaluation and live figures since it served."""
    tenant_id, name = tenant_for(storage, principal, tenant)
    return {
        "tenant": name,
        "can_approve": True,
        **stats.policies(tenant_id),
    }


@router.get("/v1/stats/ingestion")
def ingestion(
    principal: StatsPrincipal,
    storage: StorageDep,
    stats: StatsDep,
    counts: IngestStatsDep,
    tenant: str | None = Tenant,
    window: str = Window,
) -> dict[str, Any]:
    """Batches per minute and their fate, rate-limited requests, client spools, index sync."""
    tenant_id, name = tenant_for(storage, principal, tenant)
    counts.flush()  # this process's latest counts, so the page is current
    return {"tenant": name, **stats.ingestion(tenant_id, window)}


class PolicyAction(BaseModel):
    """The body of a registry action from the dashboard."""

    model_config = ConfigDict(extra="forbid")

    tenant: str | None = Field(default=None, max_length=128)
    version: str | None = Field(default=None, max_length=64)
    reason: str = Field(default="", max_length=512)


POLICY_BODY_BYTES = 16 * 1024
"""A registry action's body is a tenant, a version and a reason: a few hundred bytes."""


async def _act(
    action: str, request: Request, principal: Principal, storage: Storage, registry: Any
) -> dict[str, Any]:
    # Read here, after the token was checked, through the limits of every JSON body.
    raw = await read_json_body(request, POLICY_BODY_BYTES)
    try:
        body = PolicyAction.model_validate_json(raw)
    except ValidationError as exc:
        code = 400 if exc.errors()[0]["type"] == "json_invalid" else 422
        raise HTTPException(code, detail=validation_detail(exc)) from exc
    return await run_in_threadpool(_apply, action, body, principal, storage, registry)


def _apply(
    action: str, body: PolicyAction, principal: Principal, storage: Storage, registry: Any
) -> dict[str, Any]:
    tenant_id, name = tenant_for(storage, principal, body.tenant)
    actor = principal.actor
    try:
        if action == "promote":
            if not body.version:
                raise HTTPException(422, detail="version needed")
            registry.promote(
                tenant_id, body.version, actor=actor, reason=body.reason or "promoted by hand"
            )
        elif action == "rollback":
            if not body.version:
                raise HTTPException(422, detail="version needed: the version to roll back")
            registry.rollback(tenant_id, version=body.version, actor=actor, reason=body.reason)
        else:
            if not body.version:
                raise HTTPException(422, detail="version needed")
            registry.approve(tenant_id, body.version, actor=actor)
    except RegistryError as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from exc
    return {"tenant": name, "serving": registry.serving_version(tenant_id), "actor": actor}


@router.post("/v1/policy/promote", openapi_extra=json_body_openapi(PolicyAction))
async def promote(
    request: Request, principal: PolicyPrincipal, storage: StorageDep, registry: RegistryDep
) -> dict[str, Any]:
    """Serve `version` (the same code as `tabloop policy promote`)."""
    return await _act("promote", request, principal, storage, registry)


@router.post("/v1/policy/rollback", openapi_extra=json_body_openapi(PolicyAction))
async def rollback(
    request: Request, principal: PolicyPrincipal, storage: StorageDep, registry: RegistryDep
) -> dict[str, Any]:
    """Roll back `version`, the running canary or else the serving version (the same code as
    `tabloop policy rollback`)."""
    return await _act("rollback", request, principal, storage, registry)


@router.post("/v1/policy/approve", openapi_extra=json_body_openapi(PolicyAction))
async def approve(
    request: Request, principal: PolicyPrincipal, storage: StorageDep, registry: RegistryDep
) -> dict[str, Any]:
    """Approve a version waiting for approval, where the registry has approvals."""
    return await _act("approve", request, principal, storage, registry)
