"""Tenant authentication: bearer tokens, of which the database keeps only a hash."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, Response, status
from starlette.concurrency import run_in_threadpool

from backend.deps import MetricsDep, StorageDep
from backend.storage import Principal


def bearer_token(request: Request) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


async def require_principal(
    request: Request, storage: StorageDep, metrics: MetricsDep
) -> Principal:
    """FastAPI dependency: the tenant of the request's token, else 401.

    A cached token costs no I/O; otherwise the lookup runs in the thread pool, off the loop.
    """
    token = bearer_token(request)
    principal = None
    if token:
        principal = storage.cached_principal(token) or await run_in_threadpool(
            storage.principal_for_token, token
        )
    if principal is None:
        metrics.inc("tabloop_requests_unauthorized_total")
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="missing or unknown bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return principal


CurrentPrincipal = Annotated[Principal, Depends(require_principal)]
"""Annotate a route parameter with this to require a token and get its tenant."""


async def not_stored(response: Response) -> None:
    """FastAPI dependency: the answer is a tenant's data, which no cache may keep
    (`Cache-Control: no-store`); routes that answer with entity tags set their own."""
    response.headers["Cache-Control"] = "no-store"


NotStored = Depends(not_stored)
"""Put in a router's or route's `dependencies` to mark its answers `no-store`."""
