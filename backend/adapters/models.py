"""Tables of the tenants' adapter registries (migration `0010_adapter_registry`).

`adapter_versions` holds every version a tenant's runs produced, with the SHA-256 of each of its
files (the adapter's and its manifest's): the files themselves are blobs named by their checksum
(`backend.adapters.blobs`). `adapter_registries` is each tenant's serving state (the version
serving, the promotions a rollback steps back through, the canary, the versions waiting for
approval), one row per tenant, locked by every change; `adapter_transitions` is the append-only
log of the changes (promote, canary, approve, rollback, a canary's verdict).

A version's training record and evaluation, and a transition's figures, are stored as the JSON
text the file registry writes (`training.registry`): an evaluation may carry a NaN or an
infinity, which JSON columns of PostgreSQL refuse, and the promotion rule must read back what
was judged.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from backend.db.models import Base, BigId
from backend.policy.models import ACTOR_MAX_CHARS

JsonDocument = JSON().with_variant(JSONB(), "postgresql")


class AdapterVersionRow(Base):
    """One adapter version of a tenant: how it was trained and judged, and its files' blobs."""

    __tablename__ = "adapter_versions"
    __table_args__ = (
        UniqueConstraint("tenant_id", "number", name="uq_adapter_versions_tenant_number"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    base_model: Mapped[str] = mapped_column(String(512))
    status: Mapped[str] = mapped_column(String(32))
    train: Mapped[str] = mapped_column(Text)
    evaluation: Mapped[str | None] = mapped_column(Text, default=None)
    # File name -> SHA-256 (hex) of its bytes, the name of its blob: the adapter's files and
    # the manifest (which names the version).
    files: Mapped[dict[str, Any]] = mapped_column(JsonDocument)


class AdapterRegistryRow(Base):
    """The serving state of a tenant's adapters (`training.registry`'s state without its
    versions and log)."""

    __tablename__ = "adapter_registries"

    tenant_id: Mapped[int] = mapped_column(
        ForeignKey("tenants.id", ondelete="CASCADE"), primary_key=True
    )
    serving: Mapped[int | None] = mapped_column(Integer, default=None)
    history: Mapped[list[int]] = mapped_column(JsonDocument)
    canary: Mapped[dict[str, Any] | None] = mapped_column(JsonDocument, default=None)
    pending: Mapped[list[int]] = mapped_column(JsonDocument)


class AdapterTransitionRow(Base):
    """One change of what serves a tenant's adapters, as `training.registry` logs it."""

    __tablename__ = "adapter_transitions"
    __table_args__ = (Index("ix_adapter_transitions_tenant_id", "tenant_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    action: Mapped[str] = mapped_column(String(32))
    version: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str] = mapped_column(String(ACTOR_MAX_CHARS))
    reason: Mapped[str] = mapped_column(String(512))
    figures: Mapped[str | None] = mapped_column(Text, default=None)
