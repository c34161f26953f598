"""Training on a shared PostgreSQL database: one elected scheduler, trainers anywhere.

`ClusterTrainer` is one process's part:

- in a backend instance (`elect=True`) it stands for the `trainer` lease
  (`backend.cluster.Lease`). The holder marks every tenant with new events as wanted
  (`JobQueue.want`) every `interval_s`, and trains such jobs itself; the other instances only
  keep trying to take the lease, so when the holder dies one of them takes over within
  `failover_s` (the lease lasts two thirds of it and is tried or renewed every sixth);
- in `tabloop backend trainer` (`elect=False`, a trainer on another machine) it only claims and
  trains jobs.

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

from backend.cluster import TRAINER_LEASE, JobClaim, JobQueue, Lease, LeaseLost, holder_id
from backend.policy.dataset import latest_event_id
from backend.policy.loop import RunSummary, run_training, tenant_ids
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
        self.runs: list[RunSummary] = []
        self.leader = False
        self.became_leader_at: float | None = None  # time.time() of the last takeover
        self._current: JobClaim | None = None
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
            log.info("%s is the trainer (epoch %s)", self.holder, self.lease.epoch)
        elif self.leader and not held:
            log.warning("%s lost the trainer lease", self.holder)
        self.leader = held

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.timing.tick_s):
            if self.elect:
                self._stand()
            job = self._current
            if job is not None:
                try:
                    if not self.queue.renew(job):
                        log.warning("training job of tenant %s was lost", job.tenant_id)
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
        self._current = job
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
        summary.through_event_id = job.through_event_id
        if not self.queue.finish(job):
            log.warning("tenant %s: the job was lost as the run ended", job.tenant_id)
        self.runs.append(summary)
        return summary

    def _work_loop(self) -> None:
        if self.elect:
            self._stand()
        while not self._stop.is_set():
            try:
                if self.elect and self.leader and time.monotonic() >= self._next_schedule:
                    self.schedule()
                    self._next_schedule = time.monotonic() + self.settings.interval_s
                if self.leader or not self.elect:
                    while not self._stop.is_set() and self.run_next() is not None:
                        pass
            except Exception:
                log.warning("trainer: database unavailable", exc_info=True)
            self._stop.wait(self.timing.tick_s)
