"""Judging a tenant's adapter canary on its live decisions, and releasing a promoted version.

A tenant's promoted adapter version serves a share of the tenant's installations first
(`backend.adapters.registry`, `serving_for`: `GET /v1/model` answers each client the
version of its arm). Every decision event carries the model version that produced it
(`model_version`), so the canary's decisions and those of the version serving beside it are told
apart. Each arm's decisions since the canary started are rewarded exactly as the policy trainer
rewards them (`backend.policy.rewards`: retained accepted characters, less the distraction cost
per ignored suggestion, silence 0), and the canary is judged by `training.canary.judge_arms`:
rolled back when worse with confidence, serving alone when no worse than the tolerance with
confidence, rolled back when still undecided after `max_decisions`. Decisions without a model
version (older clients) judge nothing.

A version the tenant's run promotes becomes the canary (`backend.adapters.run.train_tenant`, at
`AdapterSchedule.canary.share`), or waits for approval for a tenant that requires it.
`settle_model_canary` runs where the policy canary is judged: in the backend's training pass over
the tenants (`backend.policy.loop.TrainingScheduler`, `backend.scheduler.ClusterTrainer`).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from backend.adapters.run import tenant_registry
from backend.policy.dataset import load_logged
from backend.policy.settings import TrainerSettings
from backend.storage import Storage
from training.canary import ModelCanarySettings, judge_arms, verdict_reason
from training.registry import AdapterRegistryError, version_label

log = logging.getLogger(__name__)

CANARY_ACTOR = "canary"


def settle_model_canary(
    storage: Storage,
    tenant_id: int,
    tenant: str,
    cache_dir: Path,
    settings: ModelCanarySettings,
    trainer: TrainerSettings,
    *,
    now: datetime | None = None,
    blob_url: str | None = None,
) -> dict[str, Any] | None:
    """Judge the tenant's running adapter canary and apply the verdict; None when none runs.

    Returns the verdict's figures with `outcome` and `version`."""
    try:
        registry = tenant_registry(storage, cache_dir, tenant, blob_url, tenant_id=tenant_id)
    except ValueError:  # a name that cannot name an adapter directory has no adapters
        return None
    canary = registry.canary()
    if canary is None:
        return None
    label, previous = version_label(canary.version), version_label(canary.previous)
    data = load_logged(
        storage,
        tenant_id,
        window=trainer.window_events,
        now=now or datetime.now(UTC),
        settings=trainer.rewards,
    )
    started = datetime.fromtimestamp(canary.started, UTC)
    arms: dict[str, list[float]] = {label: [], previous: []}
    for decision in data.decisions:
        if decision.model_version in arms and decision.time >= started:
            arms[decision.model_version].append(decision.reward)
    verdict = judge_arms(arms[label], arms[previous], settings)
    report = {
        "version": label,
        "previous": previous,
        "share": canary.share,
        "outcome": verdict.outcome,
        **verdict.figures,
    }
    if verdict.outcome == "wait":
        return report
    try:
        registry.finish_canary(
            promote=verdict.outcome == "promote",
            version=canary.version,  # the canary judged: no other that started meanwhile
            actor=CANARY_ACTOR,
            reason=verdict_reason(verdict),
            figures=verdict.figures,
        )
    except AdapterRegistryError as exc:  # ended meanwhile (an operator's rollback)
        log.info("tenant %s: adapter canary %s not settled: %s", tenant, label, exc)
        return {**report, "outcome": "wait", "not_settled": str(exc)}
    log.info("tenant %s: adapter canary %s %s", tenant, label, verdict_reason(verdict))
    return report


class ModelCanaryJudge:
    """`settle_model_canary` by tenant id, as the training pass calls it
    (`backend.policy.loop.TenantJudge`)."""

    def __init__(
        self,
        storage: Storage,
        cache_dir: Path,
        settings: ModelCanarySettings,
        trainer: TrainerSettings,
        blob_url: str | None = None,
    ) -> None:
        self.storage = storage
        self.cache_dir = cache_dir
        self.settings = settings
        self.trainer = trainer
        self.blob_url = blob_url

    def __call__(self, tenant_id: int) -> dict[str, Any] | None:
        name = dict(self.storage.tenants()).get(tenant_id)
        if name is None:
            return None
        return settle_model_canary(
            self.storage,
            tenant_id,
            name,
            self.cache_dir,
            self.settings,
            self.trainer,
            blob_url=self.blob_url,
        )
