"""Settings of telemetry: the `telemetry` section of tabloop's configuration."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class TelemetrySettings(BaseModel):
    """What is reported to the training backend, and where."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    level: Literal["off", "metrics", "full"] = Field(
        "metrics",
        description="`off`; `metrics` (no code, paths or identifiers); `full` (opt-in: adds "
        "prompt and suggestion text).",
    )
    client_enabled: bool = Field(
        True,
        description="Set by the editor from its own telemetry switch (VS Code's "
        "`isTelemetryEnabled`); false turns reporting off like `level = off`.",
    )
