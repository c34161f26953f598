"""The job scheduler on a shared PostgreSQL database: one elected scheduler of policy and adapter
training jobs, trainers anywhere.

`ClusterTrainer` is one process's part:

- in a backend instance (`elect=True`) it stands for the `trainer` lease
  (`backend.cluster.Lease`). The holder marks every tenant with new events as wanted
  (`JobQueue.want`) every `interval_s`, and trains such jobs itself; the other instances only
  keep trying to take the lease, so when the holder dies one of them takes over within
  `failover_s` (the lease lasts two thirds of it and is tried or renewed every sixth);
- in `tabloop backend trainer` (`elect=False`, a trainer on another machine) it only claims and
  trains jobs.

With an `AdapterSchedule` the same process also takes part in adapter training: the elected
scheduler marks each tenant due for an adapter (`backend.adapters.scheduler.check_tenant`) as
wanted in the `adapter_jobs` queue every `every_s`, and every process given the schedule claims
such jobs after the policy's (a GPU node runs `tabloop backend trainer --adapters`). An adapter
run keeps its checkpoints in the tenant's run directory under the cache directory; a killed
trainer's job is claimed again when its claim expires and resumes from the last checkpoint
(the cache directory must be shared between the processes for that, and for serving).

A job is trained under its claim: a heartbeat renews it while the run lasts, and every write the
run makes to the registry (candidate, canary, promotion) checks in its own transaction that the
claim is still this trainer's (`PolicyRegistry.fenced`). A trainer killed mid-run leaves a claim
that expires; the job is claimed again and run from the start, and nothing the dead run did not
commit is left behind. A run that lost its claim while alive commits nothing more.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.adapters.dataset import newest_event_row
from backend.adapters.run import TenantTrainingError, train_tenant
from backend.adapters.scheduler import AdapterPass, AdapterSchedule, check_tenant, check_tenants
from backend.cluster import TRAINER_LEASE, JobClaim, JobQueue, Lease, LeaseLost, holder_id
from backend.metrics import Metrics
from backend.policy.dataset import latest_event_id
from backend.policy.loop import (
    RunSummary,
    TenantJudge,
    judge_model_canary,
    run_training,
    tenant_ids,
)
from backend.policy.registry import PolicyRegistry
from backend.policy.settings import TrainerSettings
from backend.storage import Storage

log = logging.getLogger(__name__)

DEFAULT_FAILOVER_S = 30.0


@dataclass(frozen=True)
class FailoverTiming:
    """The lease's length and the renewal/retry period that bound a takeover to `failover_s`:
    at worst the lease runs `ttl_s` after its holder's last renewal, and a standby tries
    `tick_s` later."""

    failover_s: float

    @property
    def ttl_s(self) -> float:
        return self.failover_s * 2 / 3

    @property
    def tick_s(self) -> float:
        return self.failover_s / 6


class ClusterTrainer:
    """This process's part in training on a shared database (see the module)."""

    def __init__(
        self,
        storage: Storage,
        settings: TrainerSettings,
        registry: PolicyRegistry | None = None,
        *,
        failover_s: float = DEFAULT_FAILOVER_S,
        elect: bool = True,
        holder: str | None = None,
        adapters: AdapterSchedule | None = None,
        cache_dir: Path | None = None,
        model_canary: TenantJudge | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        if failover_s <= 0:
            raise ValueError("failover_s must be positive")
        self.storage = storage
        self.settings = settings
        self.registry = registry or PolicyRegistry(storage, builtin_floor=settings.show_floor)
        self.timing = FailoverTiming(failover_s)
        self.elect = elect
        self.holder = holder or holder_id("backend" if elect else "trainer")
        self.lease = Lease(storage.engine, TRAINER_LEASE, self.holder, self.timing.ttl_s)
        self.queue = JobQueue(storage.engine, self.holder, self.timing.ttl_s)
        if adapters is not None and cache_dir is None:
            raise ValueError("adapter training needs a cache directory")
        self.adapters = adapters
        self.cache_dir = cache_dir
        self.model_canary = model_canary
        self.adapter_queue = (
            JobQueue(storage.engine, self.holder, self.timing.ttl_s, "adapter_jobs")
            if adapters is not None
            else None
        )
        self.adapter_runs: list[dict[str, Any]] = []
        self.metrics = metrics
        self.last_adapter_pass: AdapterPass | None = None
        self._next_adapter_schedule = 0.0
        self.runs: list[RunSummary] = []
        self.leader = False
        self.became_leader_at: float | None = None  # time.time() of the last takeover
        self._current: tuple[JobQueue, JobClaim] | None = None
        self._next_schedule = 0.0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- life -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the work thread and the heartbeat thread."""
        if self._threads:
            return
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._work_loop, name="tabloop-cluster-trainer", daemon=True),
            threading.Thread(target=self._heartbeat_loop, name="tabloop-lease", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop after the run in progress, give the lease up; True when both threads ended."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        ended = not any(thread.is_alive() for thread in self._threads)
        self._threads = []
        if self.leader:
            try:
                self.lease.release()
            except Exception:  # the database may be gone; the lease then simply expires
                log.warning("trainer lease not released", exc_info=True)
            self.leader = False
        return ended

    # -- election -------------------------------------------------------------------------

    def _stand(self) -> None:
        """Take or renew the lease, and note a change of role."""
        try:
            held = self.lease.acquire()
        except Exception:
            log.warning("trainer lease: database unavailable", exc_info=True)
            held = False
        if held and not self.leader:
            self.became_leader_at = time.time()
            self._next_schedule = 0.0  # a new leader looks for work at once
            self._next_adapter_schedule = 0.0
            log.info("%s is the trainer (epoch %s)", self.holder, self.lease.epoch)
        elif self.leader and not held:
            log.warning("%s lost the trainer lease", self.holder)
        self.leader = held

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.timing.tick_s):
            if self.elect:
                self._stand()
            current = self._current
            if current is not None:
                queue, job = current
                try:
                    if not queue.renew(job):
                        log.warning("%s job of tenant %s was lost", queue.table, job.tenant_id)
                except Exception:
                    log.warning("training job claim not renewed", exc_info=True)

    # -- work -----------------------------------------------------------------------------

    def schedule(self) -> int:
        """Mark every tenant with events newer than its last run as wanted; returns how many
        tenants were looked at."""
        tenants = tenant_ids(self.storage)
        for tenant_id in tenants:
            newest = latest_event_id(self.storage, tenant_id)
            if newest > 0:
                self.queue.want(tenant_id, newest)
        return len(tenants)

    def run_next(self) -> RunSummary | None:
        """Claim one wanted job and train it; None when there was none (or its run failed)."""
        job = self.queue.claim()
        if job is None:
            return None
        self._current = (self.queue, job)
        try:
            registry = self.registry.fenced(lambda session: self.queue.fence(job, session))
            summary = run_training(self.storage, job.tenant_id, self.settings, registry=registry)
        except LeaseLost as exc:
            log.warning("tenant %s: run abandoned, %s", job.tenant_id, exc)
            return None
        except Exception as exc:
            log.exception("training tenant %s failed", job.tenant_id)
            self.queue.finish(job, error=f"{type(exc).__name__}: {exc}")
            return None
        finally:
            self._current = None
        summary.model_canary = judge_model_canary(self.model_canary, job.tenant_id)
        summary.through_event_id = job.through_event_id
        if not self.queue.finish(job):
            log.warning("tenant %s: the job was lost as the run ended", job.tenant_id)
        self.runs.append(summary)
        return summary

    def schedule_adapters(self) -> int:
        """Mark every tenant due for an adapter run as wanted in the adapter queue; returns how
        many were marked (the skipped are counted in `metrics` and `last_adapter_pass`)."""
        if self.adapters is None or self.adapter_queue is None or self.cache_dir is None:
            return 0
        found = check_tenants(
            self.storage, self.cache_dir, self.adapters, self.metrics, resume=False
        )
        self.last_adapter_pass = found
        for check in found.due:
            self.adapter_queue.want(
                check.tenant_id, newest_event_row(self.storage, check.tenant_id)
            )
        return len(found.due)

    def run_next_adapter(self) -> dict[str, Any] | None:
        """Claim one wanted adapter job and run it (resuming its checkpoint if a trainer before
        this one died in it); its report, or None when there was none (or it was lost)."""
        queue = self.adapter_queue
        if queue is None or self.adapters is None or self.cache_dir is None:
            return None
        job = queue.claim()
        if job is None:
            return None
        names = dict(self.storage.tenants())
        self._current = (queue, job)

        def publish(action: Any) -> Any:
            # The registry write happens while the job row is locked and checked to be ours.
            with self.storage.engine.begin() as connection:
                queue.fence(job, connection)
                return action()

        name = names[job.tenant_id]
        try:
            check = check_tenant(self.storage, job.tenant_id, name, self.cache_dir, self.adapters)
            if not check.due:
                # Wanted again while a run was in progress, and that run covered it.
                report = {"tenant": name, "skipped": "nothing new since the last adapter run"}
            else:
                report = train_tenant(
                    self.storage,
                    name,
                    self.cache_dir,
                    self.adapters.options(),
                    publish=publish,
                )
        except LeaseLost as exc:
            log.warning("tenant %s: adapter run abandoned, %s", job.tenant_id, exc)
            return None
        except TenantTrainingError as exc:
            report = {"tenant": name, "skipped": str(exc)}
        except Exception as exc:
            log.exception("adapter training of tenant %s failed", job.tenant_id)
            queue.finish(job, error=f"{type(exc).__name__}: {exc}")
            return None
        finally:
            self._current = None
        if not queue.finish(job):
            log.warning("tenant %s: the adapter job was lost as the run ended", job.tenant_id)
        self.adapter_runs.append(report)
        return report

    def _work_loop(self) -> None:
        if self.elect:
            self._stand()
        while not self._stop.is_set():
            try:
                if self.elect and self.leader and time.monotonic() >= self._next_schedule:
                    self.schedule()
                    self._next_schedule = time.monotonic() + self.settings.interval_s
                adapters = self.adapters
                if (
                    self.elect
                    and self.leader
                    and adapters is not None
                    and adapters.enabled
                    and time.monotonic() >= self._next_adapter_schedule
                ):
                    self.schedule_adapters()
                    self._next_adapter_schedule = time.monotonic() + adapters.every_s
                if self.leader or not self.elect:
                    while not self._stop.is_set() and (
                        self.run_next() is not None or self.run_next_adapter() is not None
                    ):
                        pass
            except Exception:
                log.warning("trainer: database unavailable", exc_info=True)
            self._stop.wait(self.timing.tick_s)
