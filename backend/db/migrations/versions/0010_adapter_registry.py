"""Tenant adapter registries in the database: versions, serving state, transitions.

The adapter versions of a backend tenant were a JSON file under the backend's cache directory;
they are rows now, and their files blobs named by their SHA-256 (`backend/adapters/`). A tenant's
file registry is copied in on its first use (`backend.adapters.registry`).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JsonDocument = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _tenant(primary_key: bool = False) -> sa.Column[int]:
    return sa.Column(
        "tenant_id",
        sa.Integer(),
        sa.ForeignKey("tenants.id", ondelete="CASCADE"),
        nullable=False,
        primary_key=primary_key,
    )


def upgrade() -> None:
    op.create_table(
        "adapter_versions",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        _tenant(),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("base_model", sa.String(512), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("train", sa.Text(), nullable=False),
        sa.Column("evaluation", sa.Text(), nullable=True),
        sa.Column("files", JsonDocument, nullable=False),
        sa.UniqueConstraint("tenant_id", "number", name="uq_adapter_versions_tenant_number"),
    )
    op.create_table(
        "adapter_registries",
        _tenant(primary_key=True),
        sa.Column("serving", sa.Integer(), nullable=True),
        sa.Column("history", JsonDocument, nullable=False),
        sa.Column("canary", JsonDocument, nullable=True),
        sa.Column("pending", JsonDocument, nullable=False),
    )
    op.create_table(
        "adapter_transitions",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        _tenant(),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("version", sa.String(32), nullable=False),
        sa.Column("actor", sa.String(200), nullable=False),
        sa.Column("reason", sa.String(512), nullable=False),
        sa.Column("figures", sa.Text(), nullable=True),
    )
    op.create_index("ix_adapter_transitions_tenant_id", "adapter_transitions", ["tenant_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_adapter_transitions_tenant_id", table_name="adapter_transitions")
    op.drop_table("adapter_transitions")
    op.drop_table("adapter_registries")
    op.drop_table("adapter_versions")
