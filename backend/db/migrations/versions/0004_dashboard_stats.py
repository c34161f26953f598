"""Dashboard: token labels and admin tokens, statistics rollups (5-minute and hourly),
ingestion per minute, client spools.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
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


def _tenant() -> sa.Column[int]:
    return sa.Column(
        "tenant_id",
        sa.Integer(),
        sa.ForeignKey("tenants.id", ondelete="CASCADE"),
        primary_key=True,
    )


def _count(name: str) -> sa.Column[int]:
    return sa.Column(name, sa.BigInteger(), nullable=False, server_default="0")


def upgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("label", sa.String(64), nullable=True))
        batch.add_column(
            sa.Column("admin", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    for name in ("stats_rollup", "stats_rollup_hourly"):  # 5-minute and hourly buckets
        op.create_table(
            name,
            _tenant(),
            sa.Column("bucket", sa.BigInteger(), primary_key=True),
            sa.Column("policy_version", sa.String(128), primary_key=True),
            sa.Column("language", sa.String(64), primary_key=True),
            sa.Column("client_name", sa.String(64), primary_key=True),
            *(_count(name) for name in ROLLUP_COUNTERS),
        )
    op.create_table(
        "stats_watermarks",
        _tenant(),
        sa.Column("last_event_id", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "ingest_minutes",
        _tenant(),
        sa.Column("minute", sa.BigInteger(), primary_key=True),
        *(
            sa.Column(name, sa.BigInteger(), nullable=False)
            for name in (
                "batches",
                "events",
                "accepted",
                "duplicate",
                "rejected_events",
                "refused_batches",
                "duplicate_batches",
                "rate_limited",
            )
        ),
    )
    op.create_table(
        "client_spools",
        _tenant(),
        sa.Column("install_id", sa.String(128), primary_key=True),
        sa.Column("backlog", sa.BigInteger(), nullable=False),
        sa.Column("dropped", sa.BigInteger(), nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("client_spools")
    op.drop_table("ingest_minutes")
    op.drop_table("stats_watermarks")
    op.drop_table("stats_rollup_hourly")
    op.drop_table("stats_rollup")
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("admin")
        batch.drop_column("label")
