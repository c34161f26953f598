"""The real language server as a subprocess, spoken to in raw bytes (no LSP client library).

Tests of the wire itself (framing, malformed JSON-RPC) need to write what no client library
would send, and to see every response, including those with a null id.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).parents[2]

# A scripted model nobody answers: completion answers empty and nothing loads.
INIT_OPTIONS: dict[str, Any] = {
    "completion": {"runner": "http", "httpUrl": "http://127.0.0.1:9/v1"},
    "index": {"enabled": False},
    "telemetry": {"level": "off"},
}


def frame(message: dict[str, Any] | bytes) -> bytes:
    """One correctly framed message."""
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def request(msg_id: Any, method: str, params: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": msg_id, "method": method}
    if params is not None:
        message["params"] = params
    return message


def notification(method: str, params: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        message["params"] = params
    return message


class RawServer:
    """`python -m lsp_server --stdio`; every message it writes lands in `messages`."""

    def __init__(self, home: Path) -> None:
        env = {
            **os.environ,
            "XDG_CONFIG_HOME": str(home / "config"),
            "XDG_CACHE_HOME": str(home / "cache"),
            "HOME": str(home),
            "TABLOOP_TELEMETRY": "off",
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "lsp_server", "--stdio"],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=(home / "server.log").open("wb"),
        )
        self.messages: queue.Queue[dict[str, Any]] = queue.Queue()
        self.notifications: list[dict[str, Any]] = []  # what `responses` read past
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        while True:
            length = None
            while True:
                line = stdout.readline()
                if not line:
                    return
                if not line.strip():
                    break
                name, _, value = line.decode("ascii").partition(":")
                if name.lower() == "content-length":
                    length = int(value)
            assert length is not None, "the server wrote a frame without Content-Length"
            self.messages.put(json.loads(stdout.read(length)))

    def send(self, data: bytes) -> None:
        """Write raw bytes to the server."""
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write(data)
        stdin.flush()

    def next_message(self, timeout: float) -> dict[str, Any] | None:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            return None

    def responses(self, timeout: float, until_id: Any = None) -> list[dict[str, Any]]:
        """Responses (not server requests or notifications) read until `until_id` or quiet."""
        found: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            message = self.next_message(left if until_id is not None else min(left, 0.3))
            if message is None:
                if until_id is None:
                    break
                continue
            if "method" in message:
                self._answer_server_request(message)
                continue
            found.append(message)
            if until_id is not None and message.get("id") == until_id:
                break
        return found

    def _answer_server_request(self, message: dict[str, Any]) -> None:
        """The server asks for configuration and progress tokens; answer like an editor."""
        if "id" not in message:
            self.notifications.append(message)
            return
        result: Any = None
        if message["method"] == "workspace/configuration":
            result = [None for _ in message.get("params", {}).get("items", [])]
        self.send(frame({"jsonrpc": "2.0", "id": message["id"], "result": result}))

    def call(self, msg_id: Any, method: str, params: Any = None, timeout: float = 30) -> Any:
        """Send a request and return its response (asserting nothing else answered)."""
        self.send(frame(request(msg_id, method, params)))
        found = self.responses(timeout, until_id=msg_id)
        assert found and found[-1].get("id") == msg_id, f"no answer to {method}: {found}"
        return found[-1]

    def initialize(self, root: Path, **more: Any) -> None:
        """`initialize` (with `more` params, e.g. `trace`) and `initialized`."""
        params = {
            "processId": None,
            "rootUri": root.as_uri(),
            "capabilities": {"workspace": {"configuration": True}},
            "initializationOptions": INIT_OPTIONS,
            **more,
        }
        response = self.call("init", "initialize", params)
        assert "result" in response, response
        self.send(frame(notification("initialized", {})))

    def wait_settled(self, timeout: float = 120) -> str:
        """Wait until the engine stops loading (its imports are most of the server's memory)."""
        deadline = time.monotonic() + timeout
        state = "loading"
        while time.monotonic() < deadline:
            state = self.call("settled?", "tabloop/status")["result"]["model"]["state"]
            if state != "loading":
                break
            time.sleep(0.2)
        return state

    def alive(self) -> bool:
        return self.process.poll() is None

    def rss_kib(self) -> int:
        """Resident memory, from /proc/PID/status."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise RuntimeError("no VmRSS")

    def stop(self) -> None:
        """`shutdown` and `exit` if it still listens, then make sure the process is gone."""
        if self.alive():
            try:
                self.send(frame(request("bye", "shutdown")))
                self.responses(10, until_id="bye")
                self.send(frame(notification("exit")))
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        if self.alive():
            self.process.kill()
            self.process.wait(timeout=10)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()
