"""Judging a canary on its live decisions, and what a passing candidate becomes.

While a canary runs, each decision is the canary's with probability `share`, else the previous
version's, and the propensity logged is the mixture's. Both versions are then evaluated on the
same live decisions by inverse propensity scoring (unbiased, since the mixture gives each action
a probability no smaller than `share` times the canary's), and paired:

- gain + z * stderr < 0 (worse, with confidence): rolled back at once;
- gain - z * stderr >= -tolerance (no worse than the tolerance, with confidence): serves alone;
- otherwise it keeps its share until `canary_max_decisions`, then is rolled back.

Every transition is recorded in the registry's history with the figures it was judged on.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from backend.policy import ope
from backend.policy.dataset import load_logged
from backend.policy.registry import PolicyRegistry
from backend.policy.rewards import as_utc
from backend.policy.settings import TrainerSettings
from backend.policy.versions import CanaryState
from backend.storage import Storage

log = logging.getLogger(__name__)

CANARY_ACTOR = "canary"


@dataclass(frozen=True)
class CanaryVerdict:
    """What the live decisions say about a canary."""

    outcome: str  # "promote" | "rollback" | "wait"
    figures: dict[str, Any]


def judge_canary(
    canary: CanaryState,
    registry: PolicyRegistry,
    storage: Storage,
    tenant_id: int,
    settings: TrainerSettings,
    *,
    now: datetime | None = None,
) -> CanaryVerdict:
    """Compare the canary with the version it runs beside on the decisions made since it
    started (those logged under the canary's version: the mixture's)."""
    data = load_logged(
        storage,
        tenant_id,
        window=settings.window_events,
        now=now or datetime.now(UTC),
        settings=settings.rewards,
    )
    live = [
        d
        for d in data.decisions
        if d.policy_version == canary.version and d.time >= as_utc(canary.started_at)
    ]
    figures: dict[str, Any] = {"decisions": len(live), "share": canary.share}
    if len(live) < settings.canary_min_decisions:
        return CanaryVerdict("wait", figures)
    rows = [d.features for d in live]
    batch = ope.LoggedBatch.of(live)
    candidate = ope.ips(registry.policy(tenant_id, canary.version).p_show_batch(rows), batch)
    previous = ope.ips(registry.policy(tenant_id, canary.previous).p_show_batch(rows), batch)
    comparison = ope.compare(candidate, previous)
    z = settings.confidence_z
    figures |= {
        "canary_reward": ope.json_number(candidate.value),
        "previous_reward": ope.json_number(previous.value),
        "gain": ope.json_number(comparison.gain),
        "gain_stderr": ope.json_number(comparison.stderr),
        "tolerance": settings.canary_tolerance,
    }
    if math.isfinite(comparison.stderr) and comparison.gain + z * comparison.stderr < 0:
        outcome = "rollback"
    elif (
        math.isfinite(comparison.stderr) and comparison.lower_bound(z) >= -settings.canary_tolerance
    ):
        outcome = "promote"
    elif len(live) >= settings.canary_max_decisions:
        outcome = "rollback"  # not shown to be no worse in all that time
    else:
        outcome = "wait"
    return CanaryVerdict(outcome, figures)


def settle_canary(
    registry: PolicyRegistry,
    storage: Storage,
    tenant_id: int,
    settings: TrainerSettings,
    *,
    now: datetime | None = None,
) -> dict[str, Any] | None:
    """Judge the tenant's running canary and apply the verdict; None when none runs.

    Returns the verdict's figures with `outcome` and `version`.
    """
    canary = registry.canary(tenant_id)
    if canary is None:
        return None
    verdict = judge_canary(canary, registry, storage, tenant_id, settings, now=now)
    report = {"version": canary.version, "outcome": verdict.outcome, **verdict.figures}
    if verdict.outcome == "wait":
        return report
    gain = verdict.figures.get("gain")
    stderr = verdict.figures.get("gain_stderr")
    live = f"live gain {gain:+.3f} ± {stderr:.3f}" if gain is not None and stderr else ""
    registry.finish_canary(
        tenant_id,
        promote=verdict.outcome == "promote",
        actor=CANARY_ACTOR,
        reason=f"{verdict.outcome}: {live} over {verdict.figures['decisions']} decisions",
        figures=verdict.figures,
        version=canary.version,  # the canary judged: no other that started meanwhile
    )
    log.info("tenant %s: canary %s %s (%s)", tenant_id, canary.version, verdict.outcome, live)
    return report


def release(
    registry: PolicyRegistry,
    storage: Storage,
    tenant_id: int,
    version: str,
    settings: TrainerSettings,
    *,
    actor: str,
    reason: str,
    figures: dict[str, Any],
) -> str:
    """What a candidate that passed evaluation becomes: `pending-approval` for a tenant that
    requires approval, else a canary (or, with no canary share, the serving version)."""
    if storage.requires_approval(tenant_id):
        registry.hold_for_approval(tenant_id, version, actor=actor, reason=reason, figures=figures)
        return "pending-approval"
    if settings.canary_share > 0:
        registry.start_canary(
            tenant_id,
            version,
            share=settings.canary_share,
            actor=actor,
            reason=reason,
            figures=figures,
        )
        return "canary"
    registry.promote(tenant_id, version, actor=actor, reason=reason, figures=figures)
    return "serving"
