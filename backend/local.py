"""A backend on loopback in this process: for the demo, benchmarks and tests.

`start_local_backend()` serves the real app with uvicorn in a thread on a free port of
127.0.0.1, with a tenant and a token ready, and stops it again.
"""

from __future__ import annotations

import socket
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from backend.app import create_app
from backend.routes.events import IngestLimits
from backend.storage import Principal, Storage


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
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
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
    """A running backend: its URL, a tenant token, and the storage to inspect it."""

    def __init__(
        self,
        db_url: str | None = None,
        *,
        tenant: str = "local",
        port: int = 0,
        limits: IngestLimits | None = None,
    ) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if db_url is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="tabloop-backend-")
            db_url = f"sqlite:///{Path(self._tmp.name) / 'backend.sqlite3'}"
        self.db_url = db_url
        self.storage = Storage(db_url)
        self.token = self.storage.create_token(tenant)
        principal = self.storage.principal_for_token(self.token)
        assert principal is not None
        self.principal: Principal = principal
        self.app: FastAPI = create_app(storage=self.storage, limits=limits)
        self._server = ServerThread(self.app, bind_loopback(port))
        self.url = self._server.url
        self.port = self._server.port

    def start(self) -> LocalBackend:
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop the server and release the database (and the temporary directory, if ours)."""
        self._server.stop()
        self.storage.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def summary(self) -> dict[str, Any]:
        """Decisions per action and outcomes per kind received for the tenant."""
        return self.storage.summary(self.principal.tenant_id)

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

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
