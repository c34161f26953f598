"""A workspace's adapter canary, judged on this machine from the local feedback store.

`tabloop model promote` (and `tabloop train model --promote`) put a workspace's version in
canary at `LOCAL_CANARY.share`: each language server session is on one arm
(`AdapterRegistry.serving_for` keyed by the session), and every feedback row it keeps carries the
version that wrote the suggestion (`workspace_label`). `settle_local_canary` compares the two arms
on the rewards of the rows kept since the canary started (`training.feedback.feedback_reward`:
accepted 1, ignored or dismissed -0.25, per shown suggestion) by `training.canary.judge_arms`,
and promotes the canary or rolls it back. The language server runs it as feedback comes in.
"""

from __future__ import annotations

import logging
from typing import Any

from telemetry.events import BASE_MODEL_VERSION
from training.canary import ModelCanarySettings, judge_arms, verdict_reason
from training.feedback import FeedbackStore
from training.registry import AdapterRegistry, AdapterRegistryError, version_label

log = logging.getLogger(__name__)

WORKSPACE_PREFIX = "workspace:"
"""What a workspace's adapter versions are called in events and feedback rows, so they are never
taken for a backend tenant's versions of the same number."""
LOCAL_CANARY = ModelCanarySettings(share=0.5, min_decisions=50, max_decisions=500, tolerance=0.05)
"""A workspace's canary: half of the sessions; each arm judged after 50 shown suggestions with an
outcome; serving alone when its reward per shown suggestion is no more than 0.05 below the
serving arm's with confidence (the reward is in shares of a suggestion, not characters)."""
CANARY_ACTOR = "canary"


def workspace_label(version: int | None) -> str:
    """The model version of a workspace's adapter version (`base` for none)."""
    return BASE_MODEL_VERSION if version is None else WORKSPACE_PREFIX + version_label(version)


def settle_local_canary(
    registry: AdapterRegistry, store: FeedbackStore, settings: ModelCanarySettings = LOCAL_CANARY
) -> dict[str, Any] | None:
    """Judge the workspace's running canary on its feedback and apply the verdict; None when
    none runs. Returns the verdict's figures with `outcome` and `version`."""
    canary = registry.canary()
    if canary is None:
        return None
    label, previous = workspace_label(canary.version), workspace_label(canary.previous)
    rewards = store.rewards_by_model((label, previous), canary.started)
    verdict = judge_arms(rewards[label], rewards[previous], settings)
    report = {"version": label, "previous": previous, "outcome": verdict.outcome}
    report |= verdict.figures
    if verdict.outcome == "wait":
        return report
    try:
        registry.finish_canary(
            promote=verdict.outcome == "promote",
            version=canary.version,
            actor=CANARY_ACTOR,
            reason=verdict_reason(verdict),
            figures=verdict.figures,
        )
    except AdapterRegistryError as exc:  # ended meanwhile (`tabloop model rollback`)
        return {**report, "outcome": "wait", "not_settled": str(exc)}
    log.info("workspace canary %s: %s", label, verdict_reason(verdict))
    return report
