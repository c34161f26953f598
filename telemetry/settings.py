"""Settings of telemetry: the `telemetry` section of tabloop's configuration."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

Level = Literal["off", "metrics", "full"]


class TelemetrySettings(BaseModel):
    """What is reported to the training backend, and where."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    level: Level = Field(
        "metrics",
        description="`off`; `metrics` (no code, paths or identifiers); `full` (opt-in: adds "
        "prompt and suggestion text).",
    )
    client_enabled: bool = Field(
        True,
        description="Set by the editor from its own telemetry switch (VS Code's "
        "`isTelemetryEnabled`); false turns reporting off like `level = off`.",
    )
    backend_url: str = Field(
        "",
        description="Base URL of the training backend (`http://127.0.0.1:8765`); empty keeps "
        "events in the local spool and sends nothing.",
    )
    token: str = Field(
        "", description="Bearer token of the tenant, from `tabloop backend token create`."
    )
    spool_max_events: int = Field(
        100_000, ge=1, description="Most events the on-disk spool holds; the oldest are dropped."
    )
    spool_max_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, description="Most bytes of events the spool holds."
    )
    queue_max_events: int = Field(
        10_000,
        ge=1,
        description="Most events waiting in memory for the spool writer; beyond it they are "
        "dropped and counted.",
    )
    batch_size: int = Field(100, ge=1, le=1000, description="Most events in one request.")
    flush_interval_s: float = Field(
        2.0, gt=0, description="Longest wait before a partial batch is sent."
    )
    request_timeout_s: float = Field(10.0, gt=0, description="Timeout of one HTTP request.")
    retry_deadline_s: float = Field(
        30.0,
        gt=0,
        description="How long one batch is retried before the sender rests; the events stay "
        "spooled and are sent later.",
    )
    backoff_initial_s: float = Field(
        0.5, gt=0, description="First retry delay (jittered, doubles)."
    )
    backoff_max_s: float = Field(30.0, gt=0, description="Longest retry delay.")
    shutdown_timeout_s: float = Field(
        3.0, ge=0, description="How long shutdown keeps sending; the rest waits for next time."
    )
    ignore_after_s: float = Field(
        10.0,
        gt=0,
        description="A shown suggestion with no reaction for this long counts as ignored.",
    )
    retention_time_scale: float = Field(
        1.0,
        gt=0,
        description="Divides the 30/120/600-second retention delays; above 1 only for tests "
        "and demos.",
    )
