"""The real backend on a free loopback port, for tests of any area.

    with BackendServer(db_url) as backend:  # temp SQLite when db_url is None
        backend.url, backend.token  # configure a client with these
        backend.stored_ids()  # what the tenant has stored, one entry per row
        backend.bodies  # every request body seen, decompressed
        backend.faults.add(503, 503, retry_after="1")  # answer the next requests with these
        backend.stop_serving(); backend.start_serving()  # an outage, same port

`postgres_database()` makes a throwaway PostgreSQL database next to `TABLOOP_TEST_POSTGRES_URL`
and drops it afterwards, so tests never share tables with each other or with other suites.
"""

from __future__ import annotations

import gzip
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from backend.local import LocalBackend
from backend.metrics import Metrics
from backend.settings import BackendSettings, IngestLimits

POSTGRES_ENV = "TABLOOP_TEST_POSTGRES_URL"
Scope = dict[str, Any]
Message = dict[str, Any]


@dataclass(frozen=True)
class Fault:
    """A scripted answer: status code, optional `Retry-After`, or a dropped connection."""

    status: int
    retry_after: str | None = None
    body: bytes = b'{"detail":"scripted fault"}'


class FaultPlan:
    """Scripted answers for the next POST requests, taken in order, before the real app."""

    def __init__(self) -> None:
        self._queue: deque[Fault] = deque()
        self._lock = threading.Lock()

    def add(self, *statuses: int, retry_after: str | None = None) -> None:
        """Answer the next requests with these statuses (one each)."""
        with self._lock:
            self._queue.extend(Fault(status, retry_after) for status in statuses)

    def take(self) -> Fault | None:
        with self._lock:
            return self._queue.popleft() if self._queue else None

    def pending(self) -> int:
        with self._lock:
            return len(self._queue)


class Recorder:
    """ASGI middleware: records each POST body (decompressed) and plays scripted faults."""

    def __init__(self, app: Any, faults: FaultPlan) -> None:
        self.app = app
        self.faults = faults
        self.bodies: list[bytes] = []
        self.statuses: list[int] = []
        self._lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        headers = dict(scope["headers"])
        try:
            plain = gzip.decompress(raw) if headers.get(b"content-encoding") == b"gzip" else raw
        except (OSError, EOFError):
            plain = raw
        with self._lock:
            self.bodies.append(plain)
        fault = self.faults.take()
        if fault is not None:
            extra = [(b"retry-after", fault.retry_after.encode())] if fault.retry_after else []
            await send(
                {
                    "type": "http.response.start",
                    "status": fault.status,
                    "headers": [(b"content-type", b"application/json"), *extra],
                }
            )
            await send({"type": "http.response.body", "body": fault.body})
            self._status(fault.status)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": raw, "more_body": False}

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                self._status(int(message["status"]))
            await send(message)

        await self.app(scope, replay, watch)

    def _status(self, status: int) -> None:
        with self._lock:
            self.statuses.append(status)


class BackendServer(LocalBackend):
    """The real backend, served by uvicorn in a thread on 127.0.0.1, for one unique tenant.

    Rate limits are off unless `limits` says otherwise; every POST is recorded and may be
    answered by a scripted fault first.
    """

    def __init__(
        self,
        db_url: str | None = None,
        *,
        tenant: str | None = None,
        limits: IngestLimits | None = None,
        port: int = 0,
    ) -> None:
        self.faults = FaultPlan()
        self.recorder: Recorder | None = None
        super().__init__(
            db_url,
            tenant=tenant or f"tenant-{uuid.uuid4().hex[:8]}",
            port=port,
            settings=BackendSettings(
                limits=limits or IngestLimits(rate_events_per_s=1e9, burst_events=1e9)
            ),
            asgi_wrapper=self._wrap,
        )

    def _wrap(self, app: FastAPI) -> Recorder:
        self.recorder = Recorder(app, self.faults)
        return self.recorder

    @property
    def tenant_id(self) -> int:
        return self.principal.tenant_id

    @property
    def bodies(self) -> list[bytes]:
        """Every POST body received so far, decompressed."""
        assert self.recorder is not None
        return list(self.recorder.bodies)

    @property
    def statuses(self) -> list[int]:
        """The status of every POST answered so far."""
        assert self.recorder is not None
        return list(self.recorder.statuses)

    @property
    def metrics(self) -> Metrics:
        return self.services.metrics

    def __enter__(self) -> BackendServer:
        self.start_serving()
        return self


def postgres_url() -> str | None:
    """The PostgreSQL URL tests may use, or None when it is not configured."""
    return os.environ.get(POSTGRES_ENV) or None


@contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh, empty PostgreSQL database (URL), dropped on exit."""
    base = postgres_url()
    if base is None:
        raise RuntimeError(f"{POSTGRES_ENV} is not set")
    name = f"tabloop_t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        try:
            _drop_database(admin, name)
        finally:
            admin.dispose()


def _drop_database(admin: Any, name: str, attempts: int = 40) -> None:
    """Drop `name`, ending its sessions. An autovacuum worker that has just started on it may
    only be ended by a role in `pg_signal_backend` (`.ci/run` grants it); without that the drop
    is tried again until the worker has finished (it does within seconds on a small database)."""
    from sqlalchemy.exc import DBAPIError

    for attempt in range(attempts):
        try:
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            return
        except DBAPIError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.25)


# Fixtures: import them into a `conftest.py` to use them (`from tests.support.backend_server
# import backend, db_url, postgres_db`).


@pytest.fixture(scope="session")
def postgres_db() -> Iterator[str]:
    """One throwaway PostgreSQL database for the session; tests use their own tenants."""
    if postgres_url() is None:
        pytest.skip(f"{POSTGRES_ENV} is not set (.ci/run starts PostgreSQL and sets it)")
    with postgres_database() as url:
        yield url


@pytest.fixture(
    params=[pytest.param("sqlite", id="sqlite"), pytest.param("postgresql", id="postgresql")]
)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL: a fresh SQLite file, or the session's PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'backend.sqlite3'}"
    url: str = request.getfixturevalue("postgres_db")
    return url


@pytest.fixture
def backend(db_url: str) -> Iterator[BackendServer]:
    """The real backend serving on loopback for a fresh tenant, on each kind of database."""
    with BackendServer(db_url) as server:
        yield server


@pytest.fixture
def sqlite_backend(tmp_path: Path) -> Iterator[BackendServer]:
    """The real backend on a fresh SQLite file (for tests about the client, not the database)."""
    with BackendServer(f"sqlite:///{tmp_path / 'backend.sqlite3'}") as server:
        yield server
