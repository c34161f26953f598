"""Index sync: keyed workspace trees, chunk placements, vectors shared within a tenant.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
PATH_CHARS = 2048


def _tenant(primary_key: bool = False) -> sa.Column[int]:
    return sa.Column(
        "tenant_id",
        sa.Integer(),
        sa.ForeignKey("tenants.id", ondelete="CASCADE"),
        nullable=False,
        primary_key=primary_key,
    )


def _workspace() -> sa.Column[int]:
    return sa.Column(
        "workspace_id",
        BigId,
        sa.ForeignKey("sync_workspaces.id", ondelete="CASCADE"),
        primary_key=True,
    )


def upgrade() -> None:
    op.create_table(
        "sync_workspaces",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        _tenant(),
        sa.Column("workspace", sa.String(32), nullable=False),
        sa.Column("model", sa.String(32), nullable=False),
        sa.Column("root", sa.String(64), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("tenant_id", "workspace", "model", name="uq_sync_workspaces_key"),
    )
    op.create_table(
        "sync_nodes",
        _workspace(),
        sa.Column("path", sa.String(PATH_CHARS), primary_key=True),
        _tenant(),
        sa.Column("parent", sa.String(PATH_CHARS), nullable=False),
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("is_dir", sa.Boolean(), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
    )
    op.create_index("ix_sync_nodes_parent", "sync_nodes", ["workspace_id", "parent"])
    op.create_table(
        "sync_placements",
        _workspace(),
        sa.Column("path", sa.String(PATH_CHARS), primary_key=True),
        sa.Column("seq", sa.Integer(), primary_key=True),
        _tenant(),
        sa.Column("chunk", sa.String(32), nullable=False),
        sa.Column("start_line", sa.Integer(), nullable=False),
        sa.Column("end_line", sa.Integer(), nullable=False),
    )
    op.create_table(
        "sync_vectors",
        _tenant(primary_key=True),
        sa.Column("model", sa.String(32), primary_key=True),
        sa.Column("chunk", sa.String(32), primary_key=True),
        sa.Column("dtype", sa.String(8), nullable=False),
        sa.Column("dimension", sa.Integer(), nullable=False),
        sa.Column("vector", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("sync_vectors")
    op.drop_table("sync_placements")
    op.drop_index("ix_sync_nodes_parent", table_name="sync_nodes")
    op.drop_table("sync_nodes")
    op.drop_table("sync_workspaces")
