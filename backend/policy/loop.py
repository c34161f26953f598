"""One training run for a tenant, and the scheduler that runs them inside the backend.

A run survives bad data: stored events the schema refuses are skipped and counted in the
report's `skipped_events` (and logged), a holdout without evidence gives the verdict "not enough
signal", and a candidate that cannot be stored is reported as the run's `error` instead of
stopping the runs of other tenants.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from backend.db.models import Tenant
from backend.policy.dataset import latest_event_id, load_logged
from backend.policy.registry import PolicyRegistry, RegistryError
from backend.policy.settings import TrainerSettings
from backend.policy.trainer import train_and_judge
from backend.storage import Storage

log = logging.getLogger(__name__)

TRAINER_ACTOR = "trainer"


@dataclass
class RunSummary:
    """What one training run of a tenant did."""

    tenant_id: int
    started_at: float  # time.time()
    finished_at: float
    events: int
    serving_before: str
    candidate: str | None = None
    promoted: bool = False
    report: dict[str, Any] = field(default_factory=dict)
    through_event_id: int = 0  # newest event row the run could see (set by the scheduler)

    def as_json(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "events": self.events,
            "serving_before": self.serving_before,
            "candidate": self.candidate,
            "promoted": self.promoted,
            "seconds": round(self.finished_at - self.started_at, 3),
            "report": self.report,
        }


def run_training(
    storage: Storage,
    tenant_id: int,
    settings: TrainerSettings,
    *,
    now: datetime | None = None,
    registry: PolicyRegistry | None = None,
) -> RunSummary:
    """Train a candidate from the tenant's events, store it, and promote it if it is better.

    `registry` is the backend's own when it trains while serving; else one is made here.
    """
    started = time.time()
    if registry is None:
        registry = PolicyRegistry(storage, builtin_floor=settings.show_floor)
    serving = registry.serving_policy(tenant_id)
    data = load_logged(
        storage,
        tenant_id,
        window=settings.window_events,
        now=now or datetime.now(UTC),
        settings=settings.rewards,
    )
    decisions = data.decisions
    summary = RunSummary(tenant_id, started, started, len(decisions), serving.version)
    skipped = dict(data.skipped.most_common())
    if skipped:
        log.warning("tenant %s: skipped invalid stored events %s", tenant_id, skipped)
    if len(decisions) < settings.min_events:
        summary.report = {"skipped": f"{len(decisions)} rewarded decisions < {settings.min_events}"}
        if skipped:
            summary.report["skipped_events"] = skipped
        summary.finished_at = time.time()
        return summary

    run = train_and_judge(serving, decisions, settings, "candidate")
    assert run is not None  # enough events was checked above
    if skipped:
        run.report["skipped_events"] = skipped
    try:
        candidate = registry.add(tenant_id, run.candidate.derive, run.report)
    except RegistryError as exc:
        log.error("tenant %s: %s", tenant_id, exc)
        summary.report = {**run.report, "promote": False, "error": str(exc)}
        summary.finished_at = time.time()
        return summary
    summary.candidate = candidate.version
    summary.report = run.report
    if run.verdict.promote:
        registry.promote(
            tenant_id,
            candidate.version,
            actor=TRAINER_ACTOR,
            reason=f"DR gain {run.verdict.gain:+.4f} ± {run.verdict.gain_stderr:.4f}",
        )
        summary.promoted = True
    summary.finished_at = time.time()
    log.info(
        "tenant %s: %s from %d decisions, %s",
        tenant_id,
        candidate.version,
        len(decisions),
        "promoted" if summary.promoted else "kept " + serving.version,
    )
    return summary


def tenant_ids(storage: Storage) -> list[int]:
    with storage.session() as session:
        return list(session.scalars(select(Tenant.id).order_by(Tenant.id)))


class TrainingScheduler:
    """Trains every tenant with new events every `interval_s`, in one background thread."""

    def __init__(
        self,
        storage: Storage,
        settings: TrainerSettings,
        registry: PolicyRegistry | None = None,
    ) -> None:
        self.storage = storage
        self.settings = settings
        self.registry = registry or PolicyRegistry(storage, builtin_floor=settings.show_floor)
        self.runs: list[RunSummary] = []
        self._seen: dict[int, int] = {}  # tenant -> newest event id at its last run
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="tabloop-trainer", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def trigger(self) -> None:
        """Run now instead of at the next tick."""
        self._wake.set()

    def run_once(self) -> list[RunSummary]:
        """Train each tenant that has events newer than its last run."""
        done: list[RunSummary] = []
        with self._lock:  # one pass at a time, whoever calls
            for tenant_id in tenant_ids(self.storage):
                newest = latest_event_id(self.storage, tenant_id)
                if newest <= self._seen.get(tenant_id, 0):
                    continue
                try:
                    summary = run_training(
                        self.storage, tenant_id, self.settings, registry=self.registry
                    )
                except Exception:
                    log.exception("training tenant %s failed", tenant_id)
                    continue
                summary.through_event_id = newest
                self._seen[tenant_id] = newest
                done.append(summary)
                self.runs.append(summary)
        return done

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.settings.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            self.run_once()
