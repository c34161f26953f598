"""Policy registry: every policy version of a tenant, and the history of promotions.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JsonDocument = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _tenant() -> sa.Column[int]:
    return sa.Column(
        "tenant_id", sa.Integer(), sa.ForeignKey("tenants.id", ondelete="CASCADE"), nullable=False
    )


def upgrade() -> None:
    op.create_table(
        "policy_versions",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        _tenant(),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("parent_version", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("checksum", sa.String(80), nullable=False),
        sa.Column("artifact", sa.Text(), nullable=False),
        sa.Column("report", JsonDocument, nullable=False),
        sa.Column("rolled_back", sa.Boolean(), nullable=False),
        sa.UniqueConstraint("tenant_id", "version", name="uq_policy_versions_tenant_version"),
        sa.UniqueConstraint("tenant_id", "number", name="uq_policy_versions_tenant_number"),
    )
    op.create_table(
        "policy_promotions",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        _tenant(),
        sa.Column("version", sa.String(64), nullable=True),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("reason", sa.String(512), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_policy_promotions_tenant_id", "policy_promotions", ["tenant_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_policy_promotions_tenant_id", table_name="policy_promotions")
    op.drop_table("policy_promotions")
    op.drop_table("policy_versions")
