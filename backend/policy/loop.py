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
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from backend.db.models import Tenant
from backend.policy.canary import release, settle_canary
from backend.policy.dataset import latest_event_id, load_logged
from backend.policy.registry import PolicyRegistry, RegistryError
from backend.policy.settings import TrainerSettings
from backend.policy.trainer import train_and_judge
from backend.storage import Storage

log = logging.getLogger(__name__)

TRAINER_ACTOR = "trainer"

TenantJudge = Callable[[int], dict[str, Any] | None]
"""Judges more of a tenant in the same pass as its policy, by tenant id: the adapter canary
(`backend.adapters.canary.ModelCanaryJudge`); returns its verdict's figures, None when idle."""


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
    # The candidate's state after the run: canary, serving, pending-approval (None: kept out).
    state: str | None = None
    canary: dict[str, Any] | None = None  # the running canary's verdict at the run's start
    model_canary: dict[str, Any] | None = None  # the adapter canary's verdict after the run

    def as_json(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "events": self.events,
            "serving_before": self.serving_before,
            "candidate": self.candidate,
            "promoted": self.promoted,
            "state": self.state,
            "canary": self.canary,
            "model_canary": self.model_canary,
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
    canary = settle_canary(registry, storage, tenant_id, settings, now=now)
    if canary is not None and canary["outcome"] == "wait":
        # One change at a time: no new candidate while a canary is still being judged.
        serving_now = registry.serving_version(tenant_id)
        summary = RunSummary(tenant_id, started, time.time(), 0, serving_now, canary=canary)
        summary.report = {"skipped": f"canary {canary['version']} is still being judged"}
        return summary
    serving = registry.serving_policy(tenant_id)
    data = load_logged(
        storage,
        tenant_id,
        window=settings.window_events,
        now=now or datetime.now(UTC),
        settings=settings.rewards,
    )
    decisions = data.decisions
    summary = RunSummary(
        tenant_id, started, started, len(decisions), serving.version, canary=canary
    )
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
        summary.state = release(
            registry,
            storage,
            tenant_id,
            candidate.version,
            settings,
            actor=TRAINER_ACTOR,
            reason=f"DR gain {run.verdict.gain:+.4f} ± {run.verdict.gain_stderr:.4f}",
            figures={"gain": run.verdict.gain, "gain_stderr": run.verdict.gain_stderr},
        )
        summary.promoted = summary.state != "pending-approval"
    pruned = registry.prune(tenant_id, settings.keep_candidates)
    if pruned:
        summary.report = {**summary.report, "pruned": pruned}
    summary.finished_at = time.time()
    log.info(
        "tenant %s: %s from %d decisions, %s",
        tenant_id,
        candidate.version,
        len(decisions),
        "promoted" if summary.promoted else "kept " + serving.version,
    )
    return summary


def judge_model_canary(judge: TenantJudge | None, tenant_id: int) -> dict[str, Any] | None:
    """`judge(tenant_id)`, logged instead of raised: a damaged adapter registry must not stop
    the policy's pass."""
    if judge is None:
        return None
    try:
        return judge(tenant_id)
    except Exception as exc:
        log.exception("judging the adapter canary of tenant %s failed", tenant_id)
        return {"outcome": "error", "error": f"{type(exc).__name__}: {exc}"}


def tenant_ids(storage: Storage) -> list[int]:
    with storage.session() as session:
        return list(session.scalars(select(Tenant.id).order_by(Tenant.id)))


class TrainingScheduler:
    """Trains every tenant with new events every `interval_s`, in one background thread.

    `stop` lets the tenant in training finish its run, promotion included, and ends the pass
    there: a version is never stored without its verdict being applied.
    """

    def __init__(
        self,
        storage: Storage,
        settings: TrainerSettings,
        registry: PolicyRegistry | None = None,
        model_canary: TenantJudge | None = None,
    ) -> None:
        self.storage = storage
        self.settings = settings
        self.registry = registry or PolicyRegistry(storage, builtin_floor=settings.show_floor)
        self.model_canary = model_canary
        self.runs: list[RunSummary] = []
        self._seen: dict[int, int] = {}  # tenant -> newest event id at its last run
        self._stop = threading.Event()  # the running thread's own flag (a new one per start)
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def stopping(self) -> bool:
        """Whether `stop` was called since the last `start`."""
        return self._stop.is_set()

    def start(self) -> None:
        """Start the thread; after `stop` this starts training again."""
        if self._thread is None:
            # A fresh flag rather than clearing the old one: a thread that outlived its `stop`
            # keeps its own flag set, so it still ends after its tenant instead of resuming.
            self._stop = threading.Event()
            self._wake.clear()  # `stop` set it; the new thread waits for its first tick
            self._thread = threading.Thread(
                target=self._loop, args=(self._stop,), name="tabloop-trainer", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = 30.0) -> bool:
        """Ask the thread to stop after the tenant it is training, and wait up to `timeout` s.

        True when the thread has ended. False when it is still training: it stops on its own
        after that tenant, and the caller must leave the storage it uses open until then.
        """
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        thread.join(timeout)
        if thread.is_alive():
            log.error(
                "the trainer is still training %g s after stop; it ends after its current tenant",
                timeout,
            )
            return False
        return True

    def trigger(self) -> None:
        """Run now instead of at the next tick."""
        self._wake.set()

    def run_once(self, stop: threading.Event | None = None) -> list[RunSummary]:
        """Train each tenant that has events newer than its last run.

        Once `stop` is set (the thread passes its stop flag) the pass ends before the next
        tenant: the one in progress finishes, so none is left stored but not judged.
        """
        done: list[RunSummary] = []
        with self._lock:  # one pass at a time, whoever calls
            for tenant_id in tenant_ids(self.storage):
                if stop is not None and stop.is_set():
                    log.info("trainer stopping: tenants from %s wait for the next start", tenant_id)
                    break
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
                summary.model_canary = judge_model_canary(self.model_canary, tenant_id)
                summary.through_event_id = newest
                self._seen[tenant_id] = newest
                done.append(summary)
                self.runs.append(summary)
        return done

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self._wake.wait(self.settings.interval_s)
            self._wake.clear()
            if stop.is_set():
                break
            self.run_once(stop)
