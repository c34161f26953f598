"""A loopback HTTP server that answers scripted statuses and headers, for client tests."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Answer:
    """One scripted answer: status, headers, body, and how long to stall before answering."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b'{"ok":true}'
    stall_s: float = 0.0


class ScriptedServer:
    """An `http.server` on a free loopback port that pops one `Answer` per request (200 when
    the script is empty) and records what it was sent."""

    def __init__(self) -> None:
        self.script: list[Answer] = []
        self.bodies: list[bytes] = []
        self.seen = threading.Event()  # set on the first request
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                server.bodies.append(self.rfile.read(length))
                server.seen.set()
                answer = server.script.pop(0) if server.script else Answer()
                time.sleep(answer.stall_s)
                self.send_response(answer.status)
                for name, value in answer.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer.body)))
                self.end_headers()
                self.wfile.write(answer.body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # keep the test output clean

        self._httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        # A short poll keeps shutdown quick (the default polls twice a second).
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class _QuietServer(ThreadingHTTPServer):
    """Says nothing when a client hung up first (a test of timeouts does that on purpose)."""

    def handle_error(self, request: object, client_address: object) -> None:
        pass
