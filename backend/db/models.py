"""Tables of the backend. Every row of tenant data carries its `tenant_id`.

Schema changes go through an Alembic migration in `backend/db/migrations/versions/`; the models
here and the latest migration must describe the same schema (a test compares them).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.expression import false

# SQLite only auto-increments an INTEGER PRIMARY KEY; PostgreSQL gets a 64-bit key.
BigId = BigInteger().with_variant(Integer(), "sqlite")
JsonDocument = JSON().with_variant(JSONB(), "postgresql")


class Base(DeclarativeBase):
    """Base of every backend table."""


class Tenant(Base):
    """An organisation or user whose data is kept apart from every other tenant's."""

    __tablename__ = "tenants"
    __table_args__ = (UniqueConstraint("name", name="uq_tenants_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # A candidate that passes evaluation waits in `pending-approval` for `tabloop policy approve`.
    require_approval: Mapped[bool] = mapped_column(default=False, server_default=false())


class ApiToken(Base):
    """A bearer token of a tenant; only its SHA-256 is stored."""

    __tablename__ = "api_tokens"
    __table_args__ = (UniqueConstraint("token_hash", name="uq_api_tokens_hash"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    token_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    # Who holds the token, as the history records who acted (migration 0004).
    label: Mapped[str | None] = mapped_column(String(64), default=None)
    # An admin token reads every tenant's statistics and acts on every tenant's registry.
    admin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class StoredEvent(Base):
    """One telemetry event as received; `body` is the validated event itself."""

    __tablename__ = "events"
    __table_args__ = (
        UniqueConstraint("tenant_id", "event_id", name="uq_events_tenant_event"),
        Index("ix_events_tenant_decision", "tenant_id", "decision_id"),
        Index("ix_events_tenant_type_id", "tenant_id", "type", "id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    event_id: Mapped[str] = mapped_column(String(36))
    type: Mapped[str] = mapped_column(String(16))
    decision_id: Mapped[str] = mapped_column(String(128))
    # `action` of decisions and `kind` of outcomes, for queries that need no JSON.
    label: Mapped[str | None] = mapped_column(String(16), default=None)
    time: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    body: Mapped[dict[str, Any]] = mapped_column(JsonDocument)


# -- statistics for the dashboard (migration 0004) -----------------------------------------------

# Upper bounds (ms) of the latency histogram's bins; the last bin holds everything above.
LATENCY_BIN_EDGES_MS: tuple[float, ...] = (
    10,
    20,
    35,
    50,
    75,
    100,
    150,
    200,
    300,
    500,
    750,
    1000,
    2000,
    5000,
)
LATENCY_BINS = len(LATENCY_BIN_EDGES_MS) + 1
RETENTION_AFTER_S: tuple[int, ...] = (30, 120, 600)
# Additive counters of one rollup row, in column order. Every one is a sum, so rows of the same
# key merge by adding, whichever process rolled them up.
ROLLUP_COUNTERS: tuple[str, ...] = (
    "requests",
    "decisions",
    "shown",
    "silenced",
    "silence_policy",
    "silence_empty",
    "silence_latency",
    "accepted",
    "partial",
    "ignored",
    "dismissed",
    "outcomes",
    "accepted_chars",
    *(f"retention_base_{s}" for s in RETENTION_AFTER_S),
    *(f"retained_{s}" for s in RETENTION_AFTER_S),
    "latency_n",
    "latency_sum_ms",
    *(f"latency_bin_{i}" for i in range(LATENCY_BINS)),
)
ROLLUP_BUCKET_S = 300


def _rollup_table(name: str) -> Table:
    """Event counts of a tenant per bucket of event time (its start in Unix seconds, so windows
    are integer ranges on both databases), split by the serving policy version, the model
    (adapter) version, the language and the editor of the decision each event belongs to.
    Filled by SQL aggregation (`backend/services/stats_rollup.py`)."""
    return Table(
        name,
        Base.metadata,
        Column(
            "tenant_id",
            Integer,
            ForeignKey("tenants.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        Column("bucket", BigInteger, primary_key=True),
        Column("policy_version", String(128), primary_key=True),
        Column("model_version", String(128), primary_key=True),  # migration 0009
        Column("language", String(64), primary_key=True),
        Column("client_name", String(64), primary_key=True),
        *(Column(n, BigInteger, nullable=False, server_default="0") for n in ROLLUP_COUNTERS),
    )


# 5-minute buckets, for windows up to a day; hourly ones (the sums of the 5-minute rows of each
# hour) for longer windows: a 30-day window reads 720 buckets per policy, language and editor.
STATS_ROLLUP = _rollup_table("stats_rollup")
STATS_ROLLUP_HOURLY = _rollup_table("stats_rollup_hourly")
HOURLY_BUCKET_S = 3600


class StatsWatermark(Base):
    """The last event id (of a tenant) already counted in `stats_rollup`."""

    __tablename__ = "stats_watermarks"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    last_event_id: Mapped[int] = mapped_column(BigInteger)


class IngestMinute(Base):
    """What a tenant's clients sent in one minute (Unix seconds of its start): batches, their
    fate, and requests refused by the rate limit."""

    __tablename__ = "ingest_minutes"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    minute: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    batches: Mapped[int] = mapped_column(BigInteger, default=0)
    events: Mapped[int] = mapped_column(BigInteger, default=0)
    accepted: Mapped[int] = mapped_column(BigInteger, default=0)
    duplicate: Mapped[int] = mapped_column(BigInteger, default=0)
    rejected_events: Mapped[int] = mapped_column(BigInteger, default=0)
    refused_batches: Mapped[int] = mapped_column(BigInteger, default=0)
    duplicate_batches: Mapped[int] = mapped_column(BigInteger, default=0)
    rate_limited: Mapped[int] = mapped_column(BigInteger, default=0)


class ClientSpool(Base):
    """The spool of one installation as its sender last reported it (batch `meta`)."""

    __tablename__ = "client_spools"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    install_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    backlog: Mapped[int] = mapped_column(BigInteger)
    dropped: Mapped[int] = mapped_column(BigInteger)
    reported_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class BackendLease(Base):
    """A role one process holds at a time (`trainer`: the elected training scheduler), until
    `expires_at` by the database's clock unless its holder renews it.

    `epoch` grows by one each time the role changes hands: a holder that checks its epoch in the
    same transaction as what it writes cannot act after another has taken over.
    """

    __tablename__ = "backend_leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    epoch: Mapped[int] = mapped_column(BigInteger)
    acquired_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class _JobColumns:
    """A tenant's job: wanted while `wanted_event_id` > `done_event_id`; claimed by one trainer
    (`claimed_by`, `claim` counts the claims) until `lease_until`, which it renews while it
    trains. A claim whose lease ran out (its trainer died) is taken again."""

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    wanted_event_id: Mapped[int] = mapped_column(BigInteger)
    done_event_id: Mapped[int] = mapped_column(BigInteger, default=0)
    claim: Mapped[int] = mapped_column(BigInteger, default=0)
    claimed_by: Mapped[str | None] = mapped_column(String(200), default=None)
    claim_event_id: Mapped[int] = mapped_column(BigInteger, default=0)
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), default=None)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    runs: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_error: Mapped[str | None] = mapped_column(String(512), default=None)


class TrainingJob(_JobColumns, Base):
    """A tenant's policy training (see `_JobColumns`)."""

    __tablename__ = "training_jobs"


class AdapterJob(_JobColumns, Base):
    """A tenant's adapter training (migration 0007): the same life as a `TrainingJob`, in a
    queue of its own, so a trainer claims the kind of work it is set up for."""

    __tablename__ = "adapter_jobs"


class RateBucket(Base):
    """A tenant's token bucket shared by every instance (`--rate-limits shared`)."""

    __tablename__ = "rate_buckets"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    tokens: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
