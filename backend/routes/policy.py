"""`GET /v1/policy`: the tenant's serving policy, with an entity tag; `GET /v1/policy/versions`.

Clients poll with `If-None-Match`; an unchanged policy costs a 304 and no body. With nothing
promoted yet the built-in policy is served, so a rollback to it reaches every client too. The
scheduled trainer that promotes versions is one of the app's services (`BackendServices.trainer`),
started and stopped by the app's lifespan.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from backend.auth import CurrentPrincipal, NotStored
from backend.deps import RegistryDep

router = APIRouter()

POLICY_VERSION_HEADER = "X-Tabloop-Policy-Version"


def _matches(if_none_match: str | None, etag: str) -> bool:
    if not if_none_match:
        return False
    tags = {tag.strip().removeprefix("W/") for tag in if_none_match.split(",")}
    return "*" in tags or etag in tags


@router.get("/v1/policy")
def get_policy(principal: CurrentPrincipal, registry: RegistryDep, request: Request) -> Response:
    """The serving policy artefact of the caller's tenant (304 when the client has it)."""
    served = registry.serving_artifact(principal.tenant_id)
    headers = {
        "ETag": served.etag,
        "Cache-Control": "no-cache",
        POLICY_VERSION_HEADER: served.version,
    }
    if _matches(request.headers.get("if-none-match"), served.etag):
        return Response(status_code=304, headers=headers)
    return Response(served.artifact, media_type="application/json", headers=headers)


@router.get("/v1/policy/versions", dependencies=[NotStored])
def list_versions(principal: CurrentPrincipal, registry: RegistryDep) -> dict[str, Any]:
    """Every policy version of the tenant, and the promotion history."""
    return {
        "serving": registry.serving_version(principal.tenant_id),
        "versions": [r.as_json() for r in registry.versions(principal.tenant_id)],
        "history": registry.history(principal.tenant_id),
    }
