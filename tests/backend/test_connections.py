"""Connections that hold the server without a request are closed: an idle one, one whose head
arrives a byte at a time, and a kept-alive one after its response (raw sockets, real server)."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from backend.connections import HEAD_TIMEOUT_S, KEEP_ALIVE_S
from backend.local import LocalBackend

CLOSED_WITHIN_S = 15.0


def _closed_after(sock: socket.socket, trickle: bytes = b"") -> float:
    """Seconds until the server closes `sock`, sending `trickle` a byte a second meanwhile
    (60 when it never does)."""
    started = time.monotonic()
    sock.settimeout(1.0)
    sent = 0
    while time.monotonic() - started < 60:
        if sent < len(trickle):
            try:
                sock.sendall(trickle[sent : sent + 1])
            except OSError:
                break
            sent += 1
        try:
            if sock.recv(4096) == b"":  # a response is read past; only the close counts
                break
        except TimeoutError:
            continue
        except OSError:
            break
    return time.monotonic() - started


def test_idle_slow_head_and_kept_alive_connections_are_closed(tmp_path: Path) -> None:
    assert KEEP_ALIVE_S < HEAD_TIMEOUT_S < CLOSED_WITHIN_S
    with LocalBackend(f"sqlite:///{tmp_path / 'db.sqlite3'}") as backend:
        head = (
            f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{backend.port}\r\nX-Pad: {'a' * 64}\r\n\r\n"
        )
        cases = {
            "idle": b"",
            "slow-head": head.encode(),
            "kept-alive": b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        }
        results: dict[str, float] = {}

        def watch(name: str, data: bytes) -> None:
            with socket.create_connection(("127.0.0.1", backend.port), timeout=10) as sock:
                if name == "kept-alive":  # one whole request, answered, then silence
                    sock.sendall(data)
                    data = b""
                results[name] = _closed_after(sock, data)

        threads = [threading.Thread(target=watch, args=item) for item in cases.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        assert set(results) == set(cases)
        for name, seconds in results.items():
            assert seconds < CLOSED_WITHIN_S, (name, seconds)
        # A prompt request is still answered.
        with socket.create_connection(("127.0.0.1", backend.port), timeout=10) as sock:
            sock.sendall(cases["kept-alive"])
            assert sock.recv(12).startswith(b"HTTP/1.1 200")
