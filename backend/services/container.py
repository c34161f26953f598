"""`BackendServices`: every service of one backend app, created once, started and stopped by the
app's lifespan.

Routes get these through the typed providers of `backend/deps.py`; nothing else hangs off the
app. Tests replace one with FastAPI's `app.dependency_overrides` on its provider.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from backend.adapters.scheduler import AdapterSchedule, AdapterScheduler
from backend.metrics import Metrics
from backend.policy.loop import TrainingScheduler
from backend.policy.registry import PolicyRegistry
from backend.policy.settings import TrainerSettings
from backend.ratelimit import (
    Limiter,
    RateLimiter,
    RequestRates,
    RequestRateSettings,
    SharedRateLimiter,
)
from backend.scheduler import ClusterTrainer
from backend.services.bodies import BodyLimits
from backend.services.completions import CompletionService, RunnerLoader
from backend.services.ingest import IngestLimits
from backend.services.ingest_stats import IngestRecorder
from backend.services.served_adapters import ServedAdapters
from backend.services.stats import StatsService
from backend.services.stats_rollup import StatsRollup
from backend.storage import Storage
from backend.sync.store import IndexSyncStore
from common.paths import default_cache_dir
from completion.settings import CompletionSettings

log = logging.getLogger(__name__)


@dataclass
class BackendServices:
    """The backend's services; one of each per app."""

    storage: Storage
    limits: IngestLimits
    rate_limiter: Limiter
    metrics: Metrics
    registry: PolicyRegistry
    completions: CompletionService
    index_sync: IndexSyncStore
    stats: StatsService
    """Aggregates for the dashboard, `/v1/stats` and `tabloop stats`."""
    ingest_stats: IngestRecorder
    """Batches, refusals and client spools per tenant and minute, written every few seconds."""
    bodies: BodyLimits = field(default_factory=BodyLimits)
    """Depth and read-timeout bounds on every JSON request body."""
    request_rates: RequestRates = field(default_factory=RequestRates)
    """Per-tenant request rates of the statistics and registry-action routes."""
    trainer: TrainingScheduler | None = None
    """The scheduled trainer, when this process trains (one process of `--workers N` does)."""
    adapters: AdapterScheduler | None = None
    """The scheduled adapter trainer: when this process trains and `AdapterSchedule.every_s`
    is set (off by default)."""
    owns_storage: bool = False
    """Close the storage on stop (the app opened it)."""
    preload_model: bool = False
    """Start loading the completion model when the app starts."""
    cache_dir: Path = field(default_factory=default_cache_dir)
    """Where model weights and the tenants' adapter registries are kept."""
    served_adapters: ServedAdapters = field(init=False)
    """The tenants' serving adapters, verified before `/v1/model` serves them."""
    training_lock: IO[bytes] | None = None
    """The lock file that makes this worker the training one, held open while it runs."""
    cluster: ClusterTrainer | None = None
    """On a shared PostgreSQL database: this instance's part in the trainer election and the
    training jobs (`backend/scheduler.py`), instead of `trainer`."""

    def __post_init__(self) -> None:
        self.served_adapters = ServedAdapters(self.cache_dir)

    @classmethod
    def create(
        cls,
        storage: Storage,
        *,
        owns_storage: bool = False,
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
        adapters: AdapterSchedule | None = None,
        request_rates: RequestRateSettings | None = None,
    ) -> BackendServices:
        """The services on `storage`.

        `trainer` settings give the built-in policy's floor, served until a version is promoted
        (the same in every worker, trained or not); with `train` this process also trains on
        their schedule. `completion` chooses the model of `/v1/completions` (default: the
        bundled one, loaded on first use; `preload_model` loads it at start). `bodies` bounds
        request bodies; `metrics_tenant_labels` lets `/metrics` name tenants (off by default).

        `failover_s` (PostgreSQL only) makes `train` stand in the trainer election instead of
        training on its own: the elected instance schedules and trains the tenants' jobs, and
        another takes over within `failover_s` of its death. `shared_rate_limits` (PostgreSQL
        only) keeps the per-tenant buckets in the database, one limit across all instances.

        `adapters` with `every_s` set makes the process that trains also train the tenants'
        adapters on that period (`backend/adapters/scheduler.py`), under `cache_dir`.
        """
        limits = limits or IngestLimits()
        trainer_settings = trainer or TrainerSettings.model_validate({})
        registry = PolicyRegistry(storage, builtin_floor=trainer_settings.show_floor)
        # A batch larger than the burst must still pass when the bucket is full.
        burst = max(limits.burst_events, limits.max_batch_events)
        limiter: Limiter = (
            SharedRateLimiter(storage.url, limits.rate_events_per_s, burst)
            if shared_rate_limits
            else RateLimiter(limits.rate_events_per_s, burst)
        )
        cluster = failover_s is not None and train
        adapter_schedule = adapters if adapters is not None and adapters.enabled else None
        return cls(
            storage=storage,
            limits=limits,
            rate_limiter=limiter,
            metrics=Metrics(tenant_labels=metrics_tenant_labels),
            registry=registry,
            completions=CompletionService(
                completion or CompletionSettings(), cache_dir or default_cache_dir(), runner_loader
            ),
            index_sync=IndexSyncStore(storage),
            stats=StatsService(storage, registry, StatsRollup(storage)),
            ingest_stats=IngestRecorder(storage),
            bodies=bodies or BodyLimits(),
            request_rates=RequestRates(request_rates),
            trainer=(
                TrainingScheduler(storage, trainer_settings, registry)
                if train and not cluster
                else None
            ),
            cluster=(
                ClusterTrainer(
                    storage,
                    trainer_settings,
                    registry,
                    failover_s=failover_s,
                    adapters=adapter_schedule,
                    cache_dir=cache_dir or default_cache_dir(),
                )
                if cluster and failover_s is not None
                else None
            ),
            # On one database without an election this process trains the adapters itself;
            # in a cluster the elected instance schedules them as jobs (`ClusterTrainer`).
            adapters=(
                AdapterScheduler(storage, adapter_schedule, cache_dir or default_cache_dir())
                if train and adapter_schedule is not None and not cluster
                else None
            ),
            owns_storage=owns_storage,
            preload_model=preload_model,
            cache_dir=cache_dir or default_cache_dir(),
        )

    def start(self) -> None:
        """Start the background work: the trainer, and loading the model when asked."""
        self.ingest_stats.start()
        if self.trainer is not None:
            self.trainer.start()
        if self.cluster is not None:
            self.cluster.start()
        if self.adapters is not None:
            self.adapters.start()
        if self.preload_model:
            self.completions.preload()

    def stop(self) -> None:
        """Stop the background work and release what the app holds (blocking: joins the
        trainer's thread).

        A trainer that does not end in time keeps what it uses: the storage stays open (and this
        worker keeps the training lock) for its daemon thread, which stops after its tenant.
        """
        trainer_done = self.trainer is None or self.trainer.stop()
        if self.cluster is not None:
            trainer_done = self.cluster.stop() and trainer_done
        if self.adapters is not None:
            trainer_done = self.adapters.stop() and trainer_done
        if isinstance(self.rate_limiter, SharedRateLimiter):
            self.rate_limiter.close()
        self.completions.close()
        try:
            self.ingest_stats.stop()
        except Exception:  # the database may already be gone; these are only statistics
            log.warning("ingest statistics not written at stop", exc_info=True)
        if not trainer_done:
            log.error("leaving the storage open for the trainer thread that is still running")
            return
        if self.owns_storage:
            self.storage.close()
        if self.training_lock is not None:
            self.training_lock.close()
            self.training_lock = None
