"""Per-tenant request rates of the routes that read statistics or change the registry.

Ingestion has its own limit, in events (`IngestLimits`); these count requests, per tenant of
the token (an admin reading other tenants spends its own tenant's), in this process. A request
over the rate is answered 429 with `Retry-After`, before any query runs.
"""

from __future__ import annotations

import math
from typing import Annotated

from fastapi import Depends, HTTPException, status

from backend.auth import CurrentPrincipal
from backend.deps import Services
from backend.ratelimit import RateLimiter
from backend.storage import Principal


def _spend(limiter: RateLimiter, principal: Principal, what: str) -> Principal:
    wait = limiter.take(principal.tenant_id, 1)
    if wait > 0:
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            detail=f"too many {what} requests for this tenant",
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )
    return principal


async def stats_principal(principal: CurrentPrincipal, services: Services) -> Principal:
    """The token's principal, once its tenant's statistics rate allows another request."""
    return _spend(services.request_rates.stats, principal, "statistics")


async def policy_principal(principal: CurrentPrincipal, services: Services) -> Principal:
    """The token's principal, once its tenant's registry-action rate allows another request."""
    return _spend(services.request_rates.policy, principal, "registry action")


StatsPrincipal = Annotated[Principal, Depends(stats_principal)]
"""A token's principal, rate-limited as a statistics read."""
PolicyPrincipal = Annotated[Principal, Depends(policy_principal)]
"""A token's principal, rate-limited as a registry action."""
