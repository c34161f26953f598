"""Tables of the policy registry (migration `0002_policy_registry`).

Every version a trainer or an operator produced stays in `policy_versions`; `policy_promotions`
is the append-only history of which version served, so the serving version is its newest row and
a rollback is one more row.
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

ACTOR_MAX_CHARS = 200
"""Who acted, as the history records it: `token:` + a 64-character label + `#` + the token's
id fits with room to spare; a longer `--actor` is refused, never cut."""

JsonDocument = JSON().with_variant(JSONB(), "postgresql")


class PolicyVersionRow(Base):
    """One policy version of a tenant: its artefact and how it was judged."""

    __tablename__ = "policy_versions"
    __table_args__ = (
        UniqueConstraint("tenant_id", "version", name="uq_policy_versions_tenant_version"),
        UniqueConstraint("tenant_id", "number", name="uq_policy_versions_tenant_number"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    version: Mapped[str] = mapped_column(String(64))
    parent_version: Mapped[str | None] = mapped_column(String(64), default=None)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    checksum: Mapped[str] = mapped_column(String(80))
    artifact: Mapped[str] = mapped_column(Text)
    report: Mapped[dict[str, Any]] = mapped_column(JsonDocument)
    rolled_back: Mapped[bool] = mapped_column(default=False)


class PolicyPromotionRow(Base):
    """A change of the serving version: a promotion or a rollback. `version` None: builtin."""

    __tablename__ = "policy_promotions"
    __table_args__ = (Index("ix_policy_promotions_tenant_id", "tenant_id", "id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    version: Mapped[str | None] = mapped_column(String(64), default=None)
    action: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(ACTOR_MAX_CHARS))
    reason: Mapped[str] = mapped_column(String(512))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # What the change was judged on (a canary's live gain and its standard error, ...).
    figures: Mapped[dict[str, Any] | None] = mapped_column(JsonDocument, default=None)
