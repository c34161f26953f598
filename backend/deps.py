"""Typed providers of the backend's services, for route parameters.

    @router.get("/v1/thing")
    def thing(storage: StorageDep, metrics: MetricsDep) -> ...

Each provider reads the app's one `BackendServices` (`backend/services/container.py`); a test
swaps a service with `app.dependency_overrides[get_<service>] = lambda: replacement`. Providers
are `async def` only because they do no I/O: FastAPI then calls them on the event loop instead
of handing each to the thread pool.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from backend.metrics import Metrics
from backend.policy.registry import PolicyRegistry
from backend.services.completions import CompletionService
from backend.services.container import BackendServices
from backend.services.ingest_stats import IngestRecorder
from backend.services.stats import StatsService
from backend.storage import Storage
from backend.sync.store import IndexSyncStore


def services_of(request: Request) -> BackendServices:
    """The services of the app serving `request` (`create_app` put them there), for code that
    is not itself a dependency (a helper several routes call)."""
    # The one place that reaches into the app: everything else asks for a service by type.
    services: BackendServices = request.app.services
    return services


async def get_services(request: Request) -> BackendServices:
    """Provider of the app's services."""
    return services_of(request)


Services = Annotated[BackendServices, Depends(get_services)]


async def get_storage(services: Services) -> Storage:
    """The database."""
    return services.storage


async def get_metrics(services: Services) -> Metrics:
    """The counters served at `/metrics`."""
    return services.metrics


async def get_registry(services: Services) -> PolicyRegistry:
    """The policy versions of every tenant."""
    return services.registry


async def get_completion_service(services: Services) -> CompletionService:
    """The shared completion model."""
    return services.completions


async def get_index_sync(services: Services) -> IndexSyncStore:
    """The server side of the index sync."""
    return services.index_sync


async def get_stats(services: Services) -> StatsService:
    """Aggregates of the tenants' events."""
    return services.stats


async def get_ingest_stats(services: Services) -> IngestRecorder:
    """Counters of what clients sent, per tenant and minute."""
    return services.ingest_stats


StorageDep = Annotated[Storage, Depends(get_storage)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
RegistryDep = Annotated[PolicyRegistry, Depends(get_registry)]
CompletionServiceDep = Annotated[CompletionService, Depends(get_completion_service)]
IndexSyncStoreDep = Annotated[IndexSyncStore, Depends(get_index_sync)]
StatsDep = Annotated[StatsService, Depends(get_stats)]
IngestStatsDep = Annotated[IngestRecorder, Depends(get_ingest_stats)]
