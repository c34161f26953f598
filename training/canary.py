"""A model canary: which arm a client serves, and what live outcomes say about the canary.

A promoted adapter version first serves a share of clients (the canary arm) beside the version
serving before it (the serving arm). Which arm a client is on follows from a stable hash of its
key (the installation's id for a backend's tenant, the language server's session for a
workspace) and the canary's version, so a user stays on one arm for the whole canary and every
new canary draws its arms afresh.

The arms are judged on the rewards of their own decisions (each decision event carries the model
version that produced it), by the rule the policy canary applies to its paired estimate, here on
two independent samples (Welch's standard error of the difference of the means):

- gain + z * stderr < 0 (worse, with confidence): rolled back;
- gain - z * stderr >= -tolerance (no worse than the tolerance, with confidence): serves alone;
- otherwise it keeps its share until the canary arm has `max_decisions`, then is rolled back.

Nothing is judged before each arm has `min_decisions`.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

Outcome = Literal["promote", "rollback", "wait"]


class ModelCanarySettings(BaseModel):
    """How a promoted adapter version is canaried (documented in docs/learning.md)."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    share: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description=(
            "Share of clients a promoted adapter version serves first (by a stable hash of "
            "each client's key); 0 serves it to every client at once."
        ),
    )
    min_decisions: int = Field(
        200, ge=2, description="Fewest rewarded decisions of each arm before it is judged."
    )
    max_decisions: int = Field(
        2000,
        ge=2,
        description="A canary not shown to be no worse after this many decisions is rolled back.",
    )
    tolerance: float = Field(
        0.5,
        ge=0.0,
        description=(
            "The canary serves alone when its reward per decision, less `confidence_z` "
            "standard errors, is no more than this below the serving arm's (the reward's unit)."
        ),
    )
    confidence_z: float = Field(1.64, ge=0.0, description="z of the one-sided bounds.")


@dataclass(frozen=True)
class CanaryVerdict:
    """What the live rewards of the two arms say about a canary."""

    outcome: Outcome
    figures: dict[str, Any]


def on_canary_arm(key: str, version: int | str, share: float) -> bool:
    """Whether the client `key` serves canary `version` (at `share`): stable for a key and
    version, and a share `share` of keys."""
    if share <= 0.0:
        return False
    if share >= 1.0:
        return True
    digest = hashlib.sha256(f"{version}\n{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def _number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def judge_arms(
    canary: Sequence[float], serving: Sequence[float], settings: ModelCanarySettings
) -> CanaryVerdict:
    """The verdict on a canary from the rewards of its decisions and of the serving arm's
    decisions made meanwhile (module docstring)."""
    figures: dict[str, Any] = {"canary_decisions": len(canary), "serving_decisions": len(serving)}
    if min(len(canary), len(serving)) < settings.min_decisions:
        return CanaryVerdict("wait", figures)
    gain = statistics.fmean(canary) - statistics.fmean(serving)
    stderr = math.sqrt(
        statistics.variance(canary) / len(canary) + statistics.variance(serving) / len(serving)
    )
    z = settings.confidence_z
    figures |= {
        "canary_reward": statistics.fmean(canary),
        "serving_reward": statistics.fmean(serving),
        "gain": _number(gain),
        "gain_stderr": _number(stderr),
        "tolerance": settings.tolerance,
    }
    outcome: Outcome
    if gain + z * stderr < 0:
        outcome = "rollback"
    elif gain - z * stderr >= -settings.tolerance:
        outcome = "promote"
    elif len(canary) >= settings.max_decisions:
        outcome = "rollback"  # not shown to be no worse in all that time
    else:
        outcome = "wait"
    return CanaryVerdict(outcome, figures)


def verdict_reason(verdict: CanaryVerdict) -> str:
    """One line for the registry's history: the verdict and the figures it rests on."""
    figures = verdict.figures
    gain, stderr = figures.get("gain"), figures.get("gain_stderr")
    live = f"live gain {gain:+.3f} ± {stderr:.3f} " if gain is not None and stderr else ""
    return (
        f"{verdict.outcome}: {live}over {figures['canary_decisions']} canary and "
        f"{figures['serving_decisions']} serving decisions"
    )
