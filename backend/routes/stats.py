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

from fastapi import APIRouter, HTTPException, Query, status
from pydantic import BaseModel, ConfigDict, Field

from backend.auth import CurrentPrincipal
from backend.deps import IngestStatsDep, RegistryDep, StatsDep, StorageDep
from backend.policy.registry import RegistryError
from backend.services.stats import DIMENSIONS, WINDOWS
from backend.storage import Principal, Storage

router = APIRouter()

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
def tenants(principal: CurrentPrincipal, storage: StorageDep) -> dict[str, Any]:
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
    principal: CurrentPrincipal,
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
    principal: CurrentPrincipal,
    storage: StorageDep,
    stats: StatsDep,
    tenant: str | None = Tenant,
    window: str = Window,
) -> dict[str, Any]:
    """The Overview's figures split by language, editor (client name) or policy version."""
    if dimension not in DIMENSIONS:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, detail=f"split by one of {', '.join(DIMENSIONS)}"
        )
    tenant_id, name = tenant_for(storage, principal, tenant)
    return {"tenant": name, **stats.split(tenant_id, window, dimension)}


@router.get("/v1/stats/policies")
def policies(
    principal: CurrentPrincipal,
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
    principal: CurrentPrincipal,
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


def _act(
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


@router.post("/v1/policy/promote")
def promote(
    body: PolicyAction, principal: CurrentPrincipal, storage: StorageDep, registry: RegistryDep
) -> dict[str, Any]:
    """Serve `version` (the same code as `tabloop policy promote`)."""
    return _act("promote", body, principal, storage, registry)


@router.post("/v1/policy/rollback")
def rollback(
    body: PolicyAction, principal: CurrentPrincipal, storage: StorageDep, registry: RegistryDep
) -> dict[str, Any]:
    """Serve the previous good version again (the same code as `tabloop policy rollback`)."""
    return _act("rollback", body, principal, storage, registry)


@router.post("/v1/policy/approve")
def approve(
    body: PolicyAction, principal: CurrentPrincipal, storage: StorageDep, registry: RegistryDep
) -> dict[str, Any]:
    """Approve a version waiting for approval, where the registry has approvals."""
    return _act("approve", body, principal, storage, registry)
