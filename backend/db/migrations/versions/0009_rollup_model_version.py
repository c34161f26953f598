"""Statistics split by model version: the rollups gain `model_version` in their key.

The rollups are sums of the events (`backend/services/stats_rollup.py`), so they are rebuilt
rather than altered: both tables are made again with the new key and the watermarks are cleared,
and the next refresh counts every stored event again (in chunks), this time by model version too.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

# Written out, not imported from the models: a migration describes the schema of its day.
ROLLUP_COUNTERS = (
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
    "retention_base_30",
    "retention_base_120",
    "retention_base_600",
    "retained_30",
    "retained_120",
    "retained_600",
    "latency_n",
    "latency_sum_ms",
    *(f"latency_bin_{i}" for i in range(15)),
)
TABLES = ("stats_rollup", "stats_rollup_hourly")


def _rebuild(with_model_version: bool) -> None:
    for name in TABLES:
        op.drop_table(name)
        keys: list[sa.Column[int] | sa.Column[str]] = [
            sa.Column(
                "tenant_id",
                sa.Integer(),
                sa.ForeignKey("tenants.id", ondelete="CASCADE"),
                primary_key=True,
            ),
            sa.Column("bucket", sa.BigInteger(), primary_key=True),
            sa.Column("policy_version", sa.String(128), primary_key=True),
        ]
        if with_model_version:
            keys.append(sa.Column("model_version", sa.String(128), primary_key=True))
        op.create_table(
            name,
            *keys,
            sa.Column("language", sa.String(64), primary_key=True),
            sa.Column("client_name", sa.String(64), primary_key=True),
            *(
                sa.Column(counter, sa.BigInteger(), nullable=False, server_default="0")
                for counter in ROLLUP_COUNTERS
            ),
        )
    op.execute(sa.text("DELETE FROM stats_watermarks"))  # count every event again


def upgrade() -> None:
    _rebuild(with_model_version=True)


def downgrade() -> None:
    _rebuild(with_model_version=False)
