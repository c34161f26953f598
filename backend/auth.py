"""Tenant authentication: bearer tokens, of which the database keeps only a hash."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status

from backend.storage import Principal, Storage


def bearer_token(request: Request) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def require_principal(request: Request) -> Principal:
    """FastAPI dependency: the tenant of the request's token, else 401.

    A plain `def`, so FastAPI runs its database lookup in the thread pool, off the event loop.
    """
    token = bearer_token(request)
    storage: Storage = request.app.state.storage
    principal = storage.principal_for_token(token) if token else None
    if principal is None:
        request.app.state.metrics.inc("tabloop_requests_unauthorized_total")
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="missing or unknown bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return principal


CurrentPrincipal = Annotated[Principal, Depends(require_principal)]
"""Annotate a route parameter with this to require a token and get its tenant."""
