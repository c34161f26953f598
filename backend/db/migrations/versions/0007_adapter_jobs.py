"""Adapter training jobs: one per tenant, claimed like the policy's training jobs.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "adapter_jobs",
        sa.Column(
            "tenant_id",
            sa.Integer(),
            sa.ForeignKey("tenants.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("wanted_event_id", sa.BigInteger(), nullable=False),
        sa.Column("done_event_id", sa.BigInteger(), nullable=False),
        sa.Column("claim", sa.BigInteger(), nullable=False),
        sa.Column("claimed_by", sa.String(200), nullable=True),
        sa.Column("claim_event_id", sa.BigInteger(), nullable=False),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("runs", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_error", sa.String(512), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("adapter_jobs")
