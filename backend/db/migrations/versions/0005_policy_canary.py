"""Policy canary and approval: figures on registry history rows, a tenant's approval switch.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

JsonDocument = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("policy_promotions") as batch:
        batch.add_column(sa.Column("figures", JsonDocument, nullable=True))
    with op.batch_alter_table("tenants") as batch:
        batch.add_column(
            sa.Column("require_approval", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("tenants") as batch:
        batch.drop_column("require_approval")
    with op.batch_alter_table("policy_promotions") as batch:
        batch.drop_column("figures")
