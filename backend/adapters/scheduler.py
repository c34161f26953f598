"""Scheduled adapter training in the backend: off unless `AdapterSchedule.every_s` is set.

Every `every_s` the scheduler looks at each tenant: one whose adapter run was interrupted (its
run directory holds a mark) is due, to resume from its checkpoint; so is one with at least
`min_new_events` shown, text-carrying decisions newer than the event its newest adapter version
was trained up to. Due tenants are trained one after the other in this process
(`backend.adapters.run.train_tenant`), each version promoted only by the registry's rule.

Training the model is heavy (minutes to hours on a CPU): the period is separate from the
policy trainer's and long by design (`--adapter-every 6h`).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

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
from backend.storage import Storage
from training.budget import Budget
from training.canary import ModelCanarySettings
from training.trainer import TrainSettings

log = logging.getLogger(__name__)


class AdapterSchedule(BaseModel):
    """When and how the backend trains its tenants' adapters (documented in docs/backend.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    every_s: float | None = Field(
        None, gt=0.0, description="Seconds between passes; None (the default) trains none."
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
    canary: ModelCanarySettings = Field(
        default_factory=lambda: ModelCanarySettings.model_validate({}),
        description="How a promoted version is canaried and judged (`backend.adapters.canary`).",
    )

    @property
    def enabled(self) -> bool:
        return self.every_s is not None

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
        )


def adapter_due(
    storage: Storage,
    tenant_id: int,
    tenant: str,
    cache_dir: Path,
    schedule: AdapterSchedule,
    *,
    resume: bool = True,
) -> bool:
    """Whether `tenant` needs an adapter run now: enough new events, or (with `resume`) a run
    that was interrupted. A cluster's scheduler passes `resume=False`: there a run in progress
    on another machine leaves its mark too, and a dead one's job is claimed again anyway."""
    registry = tenant_registry(cache_dir, tenant)
    if resume and (registry.root / RUN_DIR / MARK_FILE).is_file():
        return True
    after = last_trained_event(registry)
    new = text_decisions_after(storage, tenant_id, after, enough=schedule.min_new_events)
    return new >= schedule.min_new_events


class AdapterScheduler:
    """Trains due tenants' adapters every `schedule.every_s`, in one background thread."""

    def __init__(
        self,
        storage: Storage,
        schedule: AdapterSchedule,
        cache_dir: Path,
        settings: TrainSettings | None = None,
    ) -> None:
        if not schedule.enabled:
            raise ValueError("the adapter schedule is off (every_s is not set)")
        self.storage = storage
        self.schedule = schedule
        self.cache_dir = cache_dir
        self.settings = settings or TrainSettings()
        self.runs: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def due(self) -> list[tuple[int, str]]:
        """(id, name) of every tenant due for an adapter run."""
        due = []
        for tenant_id, name in self.storage.tenants():
            try:
                if adapter_due(self.storage, tenant_id, name, self.cache_dir, self.schedule):
                    due.append((tenant_id, name))
            except ValueError as exc:  # a name that cannot name an adapter directory
                log.warning("no adapters for tenant %r: %s", name, exc)
        return due

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
        assert self.schedule.every_s is not None
        while not stop.is_set():
            self._wake.wait(self.schedule.every_s)
            self._wake.clear()
            if stop.is_set():
                break
            try:
                self.run_once(stop)
            except Exception:  # the database may be away for a while; try again next period
                log.warning("adapter scheduler: pass failed", exc_info=True)
