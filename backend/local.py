"""A backend on loopback in this process: for the demo, benchmarks and tests.

`start_local_backend()` serves the real app with uvicorn in a thread on a free port of
127.0.0.1, with a tenant and a token ready, and stops it again.
"""

from __future__ import annotations

import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from backend.app import BackendApp, create_app
from backend.connections import server_options
from backend.services.container import BackendServices
from backend.settings import BackendSettings
from backend.storage import Principal, Storage


def answers_health(url: str, timeout: float = 2.0) -> bool:
    """Whether the backend at `url` answers `/healthz` with 200."""
    try:
        return httpx.get(f"{url}/healthz", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def wait_until_healthy(
    url: str,
    process: subprocess.Popen[bytes],
    timeout: float = 60.0,
    interval: float = 0.1,
) -> None:
    """Wait for a backend started as `process` to answer `/healthz`.

    Raises `RuntimeError` when it exits first (with its stderr, if piped) or `timeout` passes.
    """
    deadline = time.monotonic() + timeout
    while not answers_health(url, timeout=1.0):
        if process.poll() is not None:
            stderr = process.stderr.read().decode(errors="replace") if process.stderr else ""
            raise RuntimeError(f"the backend exited with {process.returncode}: {stderr[-2000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the backend did not answer /healthz within {timeout:.0f} s")
        time.sleep(interval)


def bind_loopback(port: int = 0) -> socket.socket:
    """A listening TCP socket on 127.0.0.1 (`port` 0: a free one)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    return sock


class ServerThread:
    """Serves an ASGI app with uvicorn in a daemon thread on an already bound socket."""

    def __init__(self, app: Any, sock: socket.socket) -> None:
        self.sock = sock
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="on", **server_options()
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, name="tabloop-backend", daemon=True
        )

    def start(self, timeout: float = 20.0) -> None:
        """Start serving and wait until `/healthz` answers."""
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the backend did not start")
            time.sleep(0.01)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and close the socket."""
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()


class LocalBackend:
    """A backend serving on loopback: its URL, a tenant token, and the storage to inspect it.

    `stop_serving()` and `start_serving()` close and reopen the same port (an outage, for
    tests and benchmarks); `stop()` ends it for good. `asgi_wrapper` may wrap the app in
    middleware (tests record bodies and script faults with it). The app is built from
    `settings` (default: `BackendSettings()`) on this database; with `settings.train` it also
    trains on the trainer's schedule while serving (`services.trainer`).
    """

    def __init__(
        self,
        db_url: str | None = None,
        *,
        tenant: str = "local",
        port: int = 0,
        settings: BackendSettings | None = None,
        asgi_wrapper: Callable[[FastAPI], Any] | None = None,
    ) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if db_url is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="tabloop-backend-")
            db_url = f"sqlite:///{Path(self._tmp.name) / 'backend.sqlite3'}"
        self.db_url = db_url
        self.storage = Storage(db_url)
        self.tenant = tenant
        self.token = self.storage.create_token(tenant)
        principal = self.storage.principal_for_token(self.token)
        assert principal is not None
        self.principal: Principal = principal
        self.app: BackendApp = create_app(settings, storage=self.storage)
        self._asgi: Any = asgi_wrapper(self.app) if asgi_wrapper else self.app
        self.port = port
        self._server: ServerThread | None = None

    @property
    def services(self) -> BackendServices:
        """The app's services (its metrics, registry, trainer, ...)."""
        return self.app.services

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LocalBackend:
        """Start serving; returns self."""
        self.start_serving()
        return self

    def start_serving(self) -> None:
        """Listen (again) on the same port."""
        if self._server is None:
            self._server = ServerThread(self._asgi, bind_loopback(self.port))
            self.port = self._server.port
            self._server.start()

    def stop_serving(self) -> None:
        """Close the port: clients see connection refused until `start_serving()`."""
        if self._server is not None:
            self._server.stop()
            self._server = None

    def stop(self) -> None:
        """Stop the server and release the database (and the temporary directory, if ours)."""
        self.stop_serving()
        self.storage.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def summary(self) -> dict[str, Any]:
        """Decisions per action and outcomes per kind received for the tenant."""
        return self.storage.summary(self.principal.tenant_id)

    def stored_ids(self) -> list[str]:
        """Every event id stored for the tenant, one entry per row."""
        return self.storage.event_ids(self.principal.tenant_id)

    def healthy(self) -> bool:
        """`/healthz` answers 200."""
        return answers_health(self.url)

    def __enter__(self) -> LocalBackend:
        return self.start()

    def __exit__(
        self,
        _type: type[BaseException] | None,
        _value: BaseException | None,
        _tb: TracebackType | None,
    ) -> None:
        self.stop()


def start_local_backend(db_url: str | None = None, *, tenant: str = "demo") -> LocalBackend:
    """Start a backend on a free loopback port (temporary SQLite unless `db_url`); call
    `.stop()` when done. `.url` and `.token` configure a telemetry client; `.summary()` counts
    what arrived."""
    return LocalBackend(db_url, tenant=tenant).start()
