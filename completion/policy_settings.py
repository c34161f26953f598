"""Settings of the show/silence policy on the editor side: the `policy` section.

The policy itself (weights, normalisation) comes from the backend's registry, at the address and
with the token telemetry uses; these settings say how often the client looks and how much it
explores.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from completion.settings import SECTION_CONFIG


class PolicySettings(BaseModel):
    """How the gate policy is fetched and how much it explores."""

    model_config = SECTION_CONFIG

    show_floor: float = Field(
        0.05,
        ge=0.0,
        le=1.0,
        description="Least probability of showing a non-empty suggestion, so the learning loop "
        "keeps hearing about suggestions the policy would otherwise silence.",
    )
    refresh_s: float = Field(
        60.0,
        gt=0,
        description="Seconds between checks for a newly promoted policy at the backend.",
    )
