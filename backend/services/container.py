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

from backend.adapters.canary import ModelCanaryJudge
from backend.adapters.registry import TenantAdapters
from backend.adapters.scheduler import AdapterScheduler
from backend.metrics import Metrics
from backend.policy.loop import TrainingScheduler
from backend.policy.registry import PolicyRegistry
from backend.ratelimit import (
    Limiter,
    RateLimiter,
    RequestRates,
    SharedRateLimiter,
)
from backend.scheduler import ClusterTrainer
from backend.services.completions import CompletionService, RunnerLoader
from backend.services.ingest_stats import IngestRecorder
from backend.services.lora_upstream import LoraUpstream
from backend.services.served_adapters import ServedAdapters
from backend.services.stats import StatsService
from backend.services.stats_rollup import StatsRollup
from backend.settings import BackendSettings, BodyLimits, IngestLimits
from backend.storage import Storage
from backend.sync.store import IndexSyncStore

log = logging.getLogger(__name__)


@dataclass
class BackendServices:
    """The backend's services; one of each per app."""

    storage: Storage
    settings: BackendSettings
    """The configuration the services were built from (`backend/settings.py`)."""
    limits: IngestLimits
    """Bounds on ingestion requests and the per-tenant event rate (`settings.limits`)."""
    bodies: BodyLimits
    """Depth and read-timeout bounds on every JSON request body (`settings.bodies`)."""
    rate_limiter: Limiter
    metrics: Metrics
    registry: PolicyRegistry
    completions: CompletionService
    index_sync: IndexSyncStore
    stats: StatsService
    """Aggregates for the dashboard, `/v1/stats` and `tabloop stats`."""
    ingest_stats: IngestRecorder
    """Batches, refusals and client spools per tenant and minute, written every few seconds."""
    request_rates: RequestRates = field(default_factory=RequestRates)
    """Per-tenant request rates of the statistics and registry-action routes."""
    trainer: TrainingScheduler | None = None
    """The scheduled trainer, when this process trains (one process of `--workers N` does)."""
    adapters: AdapterScheduler | None = None
    """The scheduled adapter trainer: when this process trains, unless the schedule is off
    (`AdapterSchedule.every_s` 0)."""
    owns_storage: bool = False
    """Close the storage on stop (the app opened it)."""
    served_adapters: ServedAdapters = field(init=False)
    """The tenants' serving adapters, verified before `/v1/model` serves them."""
    lora_upstream: LoraUpstream | None = field(init=False, default=None)
    """The multi-LoRA server that serves completions with the tenants' adapters, when
    `settings.lora_upstream.url` is set (`backend/services/lora_upstream.py`)."""
    training_lock: IO[bytes] | None = None
    """The lock file that makes this worker the training one, held open while it runs."""
    cluster: ClusterTrainer | None = None
    """On a shared PostgreSQL database: this instance's part in the trainer election and the
    training jobs (`backend/scheduler.py`), instead of `trainer`."""

    @property
    def cache_dir(self) -> Path:
        """Where model weights and this instance's copies of the tenants' adapters are kept."""
        return self.settings.cache_dir

    def __post_init__(self) -> None:
        self.served_adapters = ServedAdapters(
            TenantAdapters.open(self.storage, self.cache_dir, self.settings.adapters.blob_url)
        )
        upstream = self.settings.lora_upstream
        if upstream.enabled:
            stage_dir = upstream.stage_dir or self.cache_dir / "lora-upstream"
            self.lora_upstream = LoraUpstream(
                upstream, self.served_adapters, stage_dir, self.metrics
            )

    @classmethod
    def create(
        cls,
        settings: BackendSettings,
        storage: Storage,
        *,
        owns_storage: bool = False,
        runner_loader: RunnerLoader | None = None,
    ) -> BackendServices:
        """The services that `settings` describe, on `storage` (closed on stop when
        `owns_storage`); `runner_loader` replaces how the completion model is loaded (tests).

        `settings.trainer` gives the built-in policy's floor, served until a version is promoted
        (the same in every worker, trained or not); with `settings.train` this process also
        trains on its schedule. With `failover_s` (PostgreSQL only) it stands in the trainer
        election instead of training on its own: the elected instance schedules and trains the
        tenants' jobs (`backend/scheduler.py`), and another takes over within `failover_s` of
        its death. `shared_rate_limits` (PostgreSQL only) keeps the per-tenant buckets in the
        database, one limit across all instances. `settings.adapters` (on unless its `every_s`
        is 0) makes the process that trains also train the tenants' adapters on that period.
        """
        limits = settings.limits
        registry = PolicyRegistry(storage, builtin_floor=settings.trainer.show_floor)
        # A batch larger than the burst must still pass when the bucket is full.
        burst = max(limits.burst_events, limits.max_batch_events)
        limiter: Limiter = (
            SharedRateLimiter(storage.url, limits.rate_events_per_s, burst)
            if settings.shared_rate_limits
            else RateLimiter(limits.rate_events_per_s, burst)
        )
        failover_s = settings.failover_s if settings.train else None
        metrics = Metrics(tenant_labels=settings.metrics_tenant_labels)
        adapter_schedule = settings.adapters if settings.adapters.enabled else None
        # Adapter canaries are judged whenever this process trains, scheduled adapters or not:
        # a version promoted by `tabloop model promote --tenant` is a canary too.
        model_canary = ModelCanaryJudge(
            storage,
            settings.cache_dir,
            settings.adapters.canary,
            settings.trainer,
            blob_url=settings.adapters.blob_url,
        )
        return cls(
            storage=storage,
            settings=settings,
            limits=limits,
            bodies=settings.bodies,
            rate_limiter=limiter,
            metrics=metrics,
            registry=registry,
            completions=CompletionService(settings.completion, settings.cache_dir, runner_loader),
            index_sync=IndexSyncStore(storage),
            stats=StatsService(storage, registry, StatsRollup(storage)),
            ingest_stats=IngestRecorder(storage),
            request_rates=RequestRates(settings.request_rates),
            trainer=(
                TrainingScheduler(storage, settings.trainer, registry, model_canary)
                if settings.train and failover_s is None
                else None
            ),
            cluster=(
                ClusterTrainer(
                    storage,
                    settings.trainer,
                    registry,
                    failover_s=failover_s,
                    adapters=adapter_schedule,
                    cache_dir=settings.cache_dir,
                    model_canary=model_canary,
                    metrics=metrics,
                )
                if failover_s is not None
                else None
            ),
            # On one database without an election this process trains the adapters itself;
            # in a cluster the elected instance schedules them as jobs (`ClusterTrainer`).
            adapters=(
                AdapterScheduler(storage, adapter_schedule, settings.cache_dir, metrics=metrics)
                if settings.train and adapter_schedule is not None and failover_s is None
                else None
            ),
            owns_storage=owns_storage,
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
        if self.settings.preload_model:
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
        if self.lora_upstream is not None:
            self.lora_upstream.close()
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
