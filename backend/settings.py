"""`BackendSettings`: the one source of the backend's configuration.

Layered like the client's settings (`common.config`): the defaults here, then the environment
(`TABLOOP_BACKEND_<FIELD>`, and `TABLOOP_BACKEND_<SECTION>__<FIELD>` for a section's field:
`TABLOOP_BACKEND_LIMITS__RATE_EVENTS_PER_S=500`, `TABLOOP_BACKEND_TRAINER__INTERVAL_S=30`),
then what the command line sets (`tabloop backend` passes only the flags that were given). It
is built once, by the command or by whoever creates the app, and passed down: the app's
services (`backend/services/container.py`) read their parts of it.

The bounds on requests (`IngestLimits`, `BodyLimits`) live here as plain frozen dataclasses:
the routes and services that enforce them import them from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from backend.adapters.scheduler import AdapterSchedule
from backend.policy.settings import TrainerSettings
from backend.ratelimit import RequestRateSettings
from backend.storage import default_db_url
from common.config import configured_cache_dir
from completion.settings import CompletionSettings

ENV_PREFIX = "TABLOOP_BACKEND_"
DEFAULT_PORT = 8765
DEFAULT_FAILOVER_S = 30.0
PgIngest = Literal["array", "rows"]  # `backend.storage.PG_INGEST_PATHS`


@dataclass(frozen=True)
class IngestLimits:
    """Bounds on what one request may carry, and how fast a tenant may send."""

    max_body_bytes: int = 8 * 1024 * 1024  # after decompression
    max_batch_events: int = 1000
    max_event_bytes: int = 128 * 1024
    rate_events_per_s: float = 2000.0
    burst_events: float = 20000.0
    # The window around the server's clock an event's time must fall in. Back: a client spools
    # events while offline and sends them later; forward: clocks drift. Anything outside is a
    # broken clock or a forged event, and would sit at the wrong end of the trainer's holdout.
    max_event_age_s: float = 30 * 86_400.0
    max_event_lead_s: float = 86_400.0


@dataclass(frozen=True)
class BodyLimits:
    """Bounds on a JSON request body beyond its size (each route sets its own size cap)."""

    max_depth: int = 64
    """Deepest nesting of arrays and objects; the sync and event schemas need fewer than ten."""
    read_timeout_s: float = 10.0
    """Longest wait for the next piece of a body: a client that sends less than its
    `Content-Length` is answered 408 after this, not held forever."""


class LoraUpstreamSettings(BaseModel):
    """Where the tenants' adapters are served (`BackendSettings.lora_upstream`; off when `url`
    is empty: the backend's own completion model serves, without adapters)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(
        "",
        description="Base URL of an OpenAI-compatible server that loads LoRA adapters at run time "
        "(vLLM: `http://gpu-1:8000/v1`); empty keeps completions on the backend's own model.",
    )
    api_key: str = Field("", description="Bearer token for that server (vLLM's `--api-key`).")
    base_model: str = Field(
        "",
        description="The base model's name on that server (vLLM's `--served-model-name`, else the "
        "model it serves), sent as `model` for tenants without an adapter and on a fallback; "
        "empty sends none (the server's default model).",
    )
    stage_dir: Path | None = Field(
        None,
        description="Where this backend copies each served version's files for that server to "
        "read (default: `lora-upstream` in the cache directory).",
    )
    upstream_dir: str = Field(
        "",
        description="`stage_dir` as that server sees it (the path of the shared mount on its "
        "machine); empty: the same path as here (both on one machine, or mounted alike).",
    )
    timeout_s: float = Field(30.0, gt=0, description="Time limit of one completion there.")
    load_timeout_s: float = Field(120.0, gt=0, description="Time limit of loading one adapter.")
    retry_s: float = Field(
        60.0,
        ge=0,
        description="After a failed load, how long the base model serves before "
        "the load is tried again.",
    )
    retire_after_s: float = Field(
        600.0,
        ge=0,
        description="An adapter name no request was routed to for this long is unloaded there "
        "(0: never).",
    )

    @property
    def enabled(self) -> bool:
        """Whether completions go to the multi-LoRA server."""
        return bool(self.url)


class BackendSettings(BaseSettings):
    """Everything a backend process is configured with (documented in docs/backend.md)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
    )

    db_url: str = Field(
        default_factory=default_db_url,
        description="SQLAlchemy URL of the database (default: a SQLite file in the data "
        "directory); postgresql+psycopg://user:pass@host/db for PostgreSQL.",
    )
    migrate: bool = Field(True, description="Migrate the database when the app opens it.")
    host: str = Field("127.0.0.1", description="Address `tabloop backend` listens on.")
    port: int = Field(DEFAULT_PORT, ge=0, le=65_535, description="Port it listens on.")
    workers: int = Field(
        1, ge=1, description="Worker processes sharing the port (`tabloop backend`)."
    )
    log_requests: bool = Field(False, description="Log every request (`-v`).")
    cache_dir: Path = Field(
        default_factory=configured_cache_dir,
        description="Where model weights and the tenants' adapter registries are kept "
        "(default: `cacheDir` of the client's configuration or $TABLOOP_CACHE_DIR, as every "
        "command finds it, else the platform's cache directory).",
    )
    train: bool = Field(
        False,
        description="This process trains (the policy trainer, and adapters when scheduled); "
        "`tabloop backend` sets it in one worker on SQLite, in every one on PostgreSQL.",
    )
    failover_s: float | None = Field(
        None,
        gt=0.0,
        description="PostgreSQL: a process that trains stands in the trainer election instead, "
        "and another instance takes over within this many seconds of its death; None trains in "
        f"this process alone (`tabloop backend` sets {DEFAULT_FAILOVER_S:.0f} on PostgreSQL).",
    )
    shared_rate_limits: bool | None = Field(
        None,
        description="PostgreSQL: per-tenant rate limits held in the database, one limit across "
        "every instance; None keeps them per process (`tabloop backend` shares them on "
        "PostgreSQL unless `--rate-limits local`).",
    )
    pg_ingest: PgIngest = Field(
        "array",
        description="How events are inserted into PostgreSQL (`backend.storage.PG_INGEST_PATHS`).",
    )
    preload_model: bool = Field(False, description="Load the completion model at start.")
    metrics_tenant_labels: bool = Field(
        False, description="Label the per-tenant counters of the open `/metrics` with tenants."
    )
    limits: IngestLimits = Field(default_factory=IngestLimits)
    bodies: BodyLimits = Field(default_factory=BodyLimits)
    request_rates: RequestRateSettings = Field(default_factory=RequestRateSettings)
    trainer: TrainerSettings = Field(default_factory=lambda: TrainerSettings.model_validate({}))
    completion: CompletionSettings = Field(default_factory=CompletionSettings)
    adapters: AdapterSchedule = Field(
        default_factory=lambda: AdapterSchedule.model_validate({}),
        description="The tenants' adapter training (every hour; `every_s` 0 turns it off).",
    )
    lora_upstream: LoraUpstreamSettings = Field(
        default_factory=lambda: LoraUpstreamSettings.model_validate({}),
        description="A multi-LoRA server (vLLM) that serves `/v1/completions` with each tenant's "
        "adapter (docs/serving.md); off unless its `url` is set.",
    )

    @property
    def postgres(self) -> bool:
        """Whether the database is PostgreSQL."""
        from sqlalchemy.engine import make_url

        return make_url(self.db_url).get_backend_name() == "postgresql"
