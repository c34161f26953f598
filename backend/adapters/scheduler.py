"""Scheduled adapter training in the backend: on by default, every hour (`AdapterSchedule`).

A pass runs when the process that trains starts and then every `every_s`. It looks at each
tenant: one whose adapter run was interrupted (its run directory holds a mark) is due, to resume
from its checkpoint; so is one with at least `min_new_events` shown, text-carrying decisions
newer than the event its newest adapter version was trained up to. That count is one query
(`backend.adapters.dataset.text_decisions_after`), made before any dataset is built or model
loaded: a tenant whose editors do not send text (telemetry below level `full`) costs one count
per pass and is skipped. Each pass's skips are counted by reason (`AdapterPass`, the
`tabloop_adapter_tenants_total` counter of `/metrics`, a log line). Due tenants are trained one
after the other in this process (`backend.adapters.run.train_tenant`), each version promoted only
by the registry's rule.

The period: a pass over tenants with nothing new costs a count each, so it can be short; what
bounds the training is `min_new_events` and the run's budget (20 minutes). With an hour between
passes, a tenant's events reach a trained version within the period plus one run (its budget and
its evaluation). `every_s` 0 (`--adapter-every off`) turns the schedule off.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from backend.adapters.dataset import text_decisions_after
from backend.adapters.run import (
    DEFAULT_MIN_EXAMPLES,
    MARK_FILE,
    RUN_DIR,
    TenantRunOptions,
    TenantTrainingError,
    last_trained_event,
    tenant_registry,
    train_tenant,
)
from backend.metrics import Metrics
from backend.storage import Storage
from training.budget import Budget
from training.canary import ModelCanarySettings
from training.trainer import TrainSettings

log = logging.getLogger(__name__)

DEFAULT_EVERY_S = 3600.0
OFF = ("off", "none", "no", "false")
"""What `every_s` may also be given as (`--adapter-every off`, an environment variable) to turn
the schedule off, beside 0."""
TENANTS_METRIC = "tabloop_adapter_tenants_total"

# Why a pass did or did not train a tenant (`AdapterCheck.reason`, the counter's `result`).
RESUME = "resume"
DUE = "due"
NO_TEXT = "skipped_no_text"
TOO_FEW = "skipped_too_few"
SKIP_REASONS = {
    NO_TEXT: "no new text-carrying events",
    TOO_FEW: "too few new text-carrying events",
}


class AdapterSchedule(BaseModel):
    """When and how the backend trains its tenants' adapters (documented in docs/backend.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    every_s: float = Field(
        DEFAULT_EVERY_S,
        ge=0.0,
        description="Seconds between passes (the first runs at start); 0 or `off` trains none.",
    )
    min_new_events: int = Field(
        200,
        ge=1,
        description="Fewest new shown, text-carrying decisions that make a tenant due.",
    )
    budget_s: float = Field(1200.0, gt=0.0, description="Wall-clock budget of one run.")
    budget_samples: int | None = Field(
        None, ge=1, description="A budget in training examples too (the first reached ends it)."
    )
    model: str = Field("bundled", description="The base model (a `completion.model` value).")
    min_examples: int = Field(DEFAULT_MIN_EXAMPLES, ge=1)
    eval_n: int = Field(50, ge=0, description="Held-out accepted suggestions replayed.")
    promote: bool = Field(True, description="Promote by the registry's rule after evaluation.")
    device: str | None = None
    processes: int = Field(
        1,
        ge=1,
        description="Processes that train each tenant run on the trainer's machine (more than "
        "1: under torchrun, DDP; gloo on CPUs, NCCL on GPUs).",
    )
    canary: ModelCanarySettings = Field(
        default_factory=lambda: ModelCanarySettings.model_validate({}),
        description="How a promoted version is canaried and judged (`backend.adapters.canary`).",
    )
    blob_url: str | None = Field(
        None,
        description="Where the adapter files are stored, as blobs named by their SHA-256: a "
        "directory or any fsspec URL (`s3://bucket/prefix`); every instance on one database "
        "must name the same store. None: `adapter-blobs` in the cache directory.",
    )

    @field_validator("every_s", mode="before")
    @classmethod
    def _off(cls, value: Any) -> Any:
        if value is None or (isinstance(value, str) and value.strip().lower() in OFF):
            return 0.0
        return value

    @classmethod
    def off(cls, blob_url: str | None = None) -> AdapterSchedule:
        """The schedule turned off (a backend that must not train the model); its versions'
        files at `blob_url`."""
        return cls.model_validate({"every_s": 0, "blob_url": blob_url})

    @property
    def enabled(self) -> bool:
        return self.every_s > 0

    def options(self, settings: TrainSettings | None = None) -> TenantRunOptions:
        return TenantRunOptions(
            model=self.model,
            budget=Budget(samples=self.budget_samples, seconds=self.budget_s),
            settings=settings or TrainSettings(),
            min_examples=self.min_examples,
            eval_n=self.eval_n,
            promote=self.promote,
            device=self.device,
            canary_share=self.canary.share,
            blob_url=self.blob_url,
            processes=self.processes,
        )


@dataclass(frozen=True)
class AdapterCheck:
    """Whether a tenant is due for an adapter run, and why."""

    tenant_id: int
    tenant: str
    reason: str  # RESUME, DUE or one of SKIP_REASONS
    new_text_events: int = 0
    """Shown, text-carrying decisions since its newest version's mark (counted up to the
    schedule's `min_new_events`)."""

    @property
    def due(self) -> bool:
        return self.reason in (RESUME, DUE)


def check_tenant(
    storage: Storage,
    tenant_id: int,
    tenant: str,
    cache_dir: Path,
    schedule: AdapterSchedule,
    *,
    resume: bool = True,
) -> AdapterCheck:
    """Whether `tenant` needs an adapter run now: a run that was interrupted (with `resume`), or
    enough new text-carrying events, counted in one query; nothing is loaded to decide. A
    cluster's scheduler passes `resume=False`: there a run in progress on another machine leaves
    its mark too, and a dead one's job is claimed again anyway. ValueError for a tenant name
    that cannot name an adapter directory."""
    registry = tenant_registry(storage, cache_dir, tenant, schedule.blob_url, tenant_id=tenant_id)
    if resume and (registry.root / RUN_DIR / MARK_FILE).is_file():
        return AdapterCheck(tenant_id, tenant, RESUME)
    after = last_trained_event(registry)
    new = text_decisions_after(storage, tenant_id, after, enough=schedule.min_new_events)
    reason = DUE if new >= schedule.min_new_events else TOO_FEW if new else NO_TEXT
    return AdapterCheck(tenant_id, tenant, reason, new)


@dataclass
class AdapterPass:
    """What one pass over the tenants found: who is due, and how many were skipped, by reason."""

    started: float = field(default_factory=time.time)
    due: list[AdapterCheck] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)

    @property
    def checked(self) -> int:
        return len(self.due) + sum(self.skipped.values())

    def summary(self) -> str:
        """One line for the log."""
        skips = ", ".join(f"{SKIP_REASONS[r]}: {n}" for r, n in sorted(self.skipped.items()))
        return f"adapter pass: {self.checked} tenants, {len(self.due)} due" + (
            f"; skipped {sum(self.skipped.values())} ({skips})" if skips else ""
        )


def check_tenants(
    storage: Storage,
    cache_dir: Path,
    schedule: AdapterSchedule,
    metrics: Metrics | None = None,
    *,
    resume: bool = True,
) -> AdapterPass:
    """Check every tenant (`check_tenant`), count each result in `metrics`, log the pass."""
    found = AdapterPass()
    for tenant_id, name in storage.tenants():
        try:
            check = check_tenant(storage, tenant_id, name, cache_dir, schedule, resume=resume)
        except ValueError as exc:  # a name that cannot name an adapter directory
            log.warning("no adapters for tenant %r: %s", name, exc)
            continue
        if check.due:
            found.due.append(check)
        else:
            found.skipped[check.reason] += 1
            log.debug(
                "adapter of tenant %s skipped: %s (%d new, %d needed)",
                name,
                SKIP_REASONS[check.reason],
                check.new_text_events,
                schedule.min_new_events,
            )
        if metrics is not None:
            metrics.inc(TENANTS_METRIC, tenant=name, result=check.reason)
    log.info("%s", found.summary())
    return found


class AdapterScheduler:
    """Trains due tenants' adapters at start and every `schedule.every_s` after, in one
    background thread; `metrics` counts each tenant checked by result."""

    def __init__(
        self,
        storage: Storage,
        schedule: AdapterSchedule,
        cache_dir: Path,
        settings: TrainSettings | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        if not schedule.enabled:
            raise ValueError("the adapter schedule is off (every_s is 0)")
        self.storage = storage
        self.schedule = schedule
        self.cache_dir = cache_dir
        self.settings = settings or TrainSettings()
        self.metrics = metrics
        self.runs: list[dict[str, Any]] = []
        self.last_pass: AdapterPass | None = None
        self.skipped: Counter[str] = Counter()
        """Tenants skipped by every check so far, by reason."""
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def check(self) -> AdapterPass:
        """Check every tenant (`check_tenants`); the skips are counted and kept."""
        found = check_tenants(self.storage, self.cache_dir, self.schedule, self.metrics)
        self.skipped.update(found.skipped)
        self.last_pass = found
        return found

    def due(self) -> list[tuple[int, str]]:
        """(id, name) of every tenant due for an adapter run."""
        return [(check.tenant_id, check.tenant) for check in self.check().due]

    def run_once(self, stop: threading.Event | None = None) -> list[dict[str, Any]]:
        """Train every due tenant once (the one in progress finishes when `stop` is set)."""
        done: list[dict[str, Any]] = []
        with self._lock:
            for _tenant_id, name in self.due():
                if stop is not None and stop.is_set():
                    break
                try:
                    report = train_tenant(
                        self.storage, name, self.cache_dir, self.schedule.options(self.settings)
                    )
                except TenantTrainingError as exc:
                    log.info("adapter of tenant %s not trained: %s", name, exc)
                    report = {"tenant": name, "skipped": str(exc)}
                except Exception as exc:
                    log.exception("adapter training of tenant %s failed", name)
                    report = {"tenant": name, "error": f"{type(exc).__name__}: {exc}"}
                done.append(report)
                self.runs.append(report)
        return done

    def start(self) -> None:
        if self._thread is None:
            self._stop = threading.Event()
            self._wake.clear()
            self._thread = threading.Thread(
                target=self._loop, args=(self._stop,), name="tabloop-adapters", daemon=True
            )
            self._thread.start()

    def trigger(self) -> None:
        """Run a pass now instead of at the next period."""
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop after the run in progress; True when the thread has ended within `timeout`."""
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.run_once(stop)
            except Exception:  # the database may be away for a while; try again next period
                log.warning("adapter scheduler: pass failed", exc_info=True)
            self._wake.wait(self.schedule.every_s)
            self._wake.clear()
