"""Alembic environment of the backend database.

Run from `backend.db.migrate.upgrade()` (which passes an open connection) or from the `alembic`
command line with `-x url=...`.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, text

from backend.db.models import Base

config = context.config
target_metadata = Base.metadata

# Serialises concurrent upgrades of one PostgreSQL database (several replicas starting at once).
ADVISORY_LOCK_KEY = 0x7AB100B


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
            "sqlalchemy.url"
        )
        if not url:
            raise SystemExit("give the database with -x url=...")
        with create_engine(url).connect() as own:
            _run(own)
        return
    _run(connection)


def _run(connection: Connection) -> None:
    is_postgres = connection.dialect.name == "postgresql"
    if is_postgres:
        connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": ADVISORY_LOCK_KEY})
        connection.commit()
    try:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
    finally:
        if is_postgres:
            connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": ADVISORY_LOCK_KEY})
            connection.commit()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) migrations are not supported")
run_migrations_online()
