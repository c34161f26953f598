"""Fixtures of the tenant adapter tests: the real backend on loopback."""

from __future__ import annotations

from tests.support.backend_server import backend, db_url, postgres_db, sqlite_backend

__all__ = ["backend", "db_url", "postgres_db", "sqlite_backend"]
