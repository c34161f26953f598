"""Configuration of the trainer: rewards, training, evaluation and promotion rules.

Every field is documented in `docs/learning.md`; change both together.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class RewardSettings(BaseModel):
    """How an outcome becomes a reward."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    distraction_cost: float = Field(
        1.0,
        ge=0.0,
        description=(
            "λ, in characters: the reward of a shown suggestion that was ignored or dismissed "
            "is -λ (an accepted one earns its retained characters). Chosen on training data "
            "(docs/learning.md)."
        ),
    )
    retention_after_s: int = Field(
        120, description="Checkpoint whose retained share scales an accepted suggestion's reward."
    )
    retention_wait_s: float = Field(
        180.0,
        ge=0.0,
        description=(
            "How long an accepted decision waits for its retention checkpoint before it "
            "is counted as fully retained."
        ),
    )
    outcome_wait_s: float = Field(
        600.0,
        ge=0.0,
        description=(
            "How long a shown decision waits for an outcome before it is counted as ignored."
        ),
    )


class TrainerSettings(BaseModel):
    """How a candidate is trained, evaluated and promoted."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    rewards: RewardSettings = Field(default_factory=lambda: RewardSettings.model_validate({}))
    window_events: int = Field(
        200_000, ge=10, description="Most recent decisions the trainer reads per run."
    )
    min_events: int = Field(200, ge=10, description="Fewest rewarded decisions worth training on.")
    holdout_fraction: float = Field(
        0.3, gt=0.0, lt=1.0, description="Newest share of decisions kept for evaluation."
    )
    hidden: int = Field(0, ge=0, le=64, description="Hidden units of the MLP part; 0 is logistic.")
    steps: int = Field(400, ge=1, description="Full-batch optimiser steps per training run.")
    learning_rate: float = Field(0.05, gt=0.0)
    weight_clip: float = Field(
        20.0, gt=1.0, description="Largest importance weight in the training objective."
    )
    proximal: float = Field(
        1e-3,
        ge=0.0,
        description="Pull of the candidate's weights toward the serving policy's (per step).",
    )
    l2: float = Field(1e-4, ge=0.0, description="Weight decay of the candidate.")
    reward_model_ridge: float = Field(
        1.0, ge=0.0, description="Ridge penalty of the reward model used by doubly robust terms."
    )
    estimator: str = Field(
        "dr", pattern="^(dr|ips)$", description="`dr` (doubly robust) or `ips` objective."
    )
    margin: float = Field(
        0.002,
        ge=0.0,
        description="Least gain in estimated reward per request for a promotion.",
    )
    confidence_z: float = Field(
        1.64,
        ge=0.0,
        description="The paired gain's lower bound (gain - z * standard error) must exceed 0.",
    )
    min_ess: float = Field(
        50.0, ge=1.0, description="Fewest effective samples behind the candidate's estimate."
    )
    min_shown_rate: float = Field(
        0.05,
        ge=0.0,
        le=1.0,
        description=(
            "A candidate that would show fewer non-empty suggestions than this (without "
            "exploration) is never promoted."
        ),
    )
    shown_collapse_ratio: float = Field(
        0.2,
        ge=0.0,
        le=1.0,
        description="...nor one whose shown rate falls below this share of the serving policy's.",
    )
    show_floor: float = Field(
        0.05, ge=0.0, le=1.0, description="Exploration floor written into new policy versions."
    )
    canary_share: float = Field(
        0.1,
        ge=0.0,
        le=1.0,
        description=(
            "Share of decisions a newly promoted version makes while it is a canary (chosen per "
            "decision; the previous version makes the rest). 0 promotes at once."
        ),
    )
    canary_min_decisions: int = Field(
        200, ge=10, description="Fewest live rewarded decisions before a canary is judged."
    )
    canary_max_decisions: int = Field(
        2000,
        ge=10,
        description="A canary not shown to be no worse after this many decisions is rolled back.",
    )
    canary_tolerance: float = Field(
        0.5,
        ge=0.0,
        description=(
            "A canary takes all traffic when its live reward per request, less `confidence_z` "
            "standard errors, is no more than this below the previous version's (characters)."
        ),
    )
    keep_candidates: int = Field(
        20,
        ge=0,
        description=(
            "Newest never-promoted versions kept per tenant; older ones are deleted "
            "(promoted, serving, canary and pending versions are always kept)."
        ),
    )
    interval_s: float = Field(
        60.0, gt=0.0, description="Seconds between scheduled training runs inside the backend."
    )
    seed: int = Field(0, description="Seed of the trainer's initialisation.")
