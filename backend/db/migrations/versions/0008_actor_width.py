"""Who acted is recorded whole: `policy_promotions.actor` widens from 64 to 200 characters
(a token's label, up to 64, with its `token:` prefix and the token's id).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("policy_promotions") as batch:
        batch.alter_column(
            "actor", existing_type=sa.String(64), type_=sa.String(200), existing_nullable=False
        )


def downgrade() -> None:
    with op.batch_alter_table("policy_promotions") as batch:
        batch.alter_column(
            "actor", existing_type=sa.String(200), type_=sa.String(64), existing_nullable=False
        )
