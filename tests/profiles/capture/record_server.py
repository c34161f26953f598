"""A stand-in language server that records a client's capability profile.

Usage: `python record_server.py OUT.json`. It speaks JSON-RPC over stdio and writes `clientInfo` and
`capabilities` of the `initialize` params, exactly as they arrived on the wire, to OUT.json (the
profile format of pytest-lsp: the machine-specific fields, such as `processId`, `rootUri` and
`workspaceFolders`, are left out). It answers every request with an empty result and exits on
`exit`. The editor capture scripts next to it start it as their server.
"""

from __future__ import annotations

import json
import sys
from typing import Any, BinaryIO

PROFILE_FIELDS = ("clientInfo", "capabilities")


def read_message(stream: BinaryIO) -> dict[str, Any] | None:
    """One JSON-RPC message, or None at end of input."""
    length = -1
    while True:
        line = stream.readline()
        if not line:
            return None
        line = line.strip()
        if not line:
            break
        name, _, value = line.decode("ascii").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    if length < 0:
        raise ValueError("message without Content-Length")
    message: dict[str, Any] = json.loads(stream.read(length))
    return message


def write_message(stream: BinaryIO, message: dict[str, Any]) -> None:
    body = json.dumps(message).encode("utf-8")
    stream.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    stream.flush()


def main(out_path: str) -> int:
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while (message := read_message(stdin)) is not None:
        method = message.get("method")
        if method == "initialize":
            with open(out_path, "w", encoding="utf-8") as out:
                params = message["params"]
                profile = {key: params[key] for key in PROFILE_FIELDS if key in params}
                json.dump(profile, out, indent=2, sort_keys=True)
                out.write("\n")
            result: Any = {
                "capabilities": {"textDocumentSync": 1, "inlineCompletionProvider": True},
                "serverInfo": {"name": "record-server"},
            }
        else:
            result = None
        if method == "exit":
            return 0
        if "id" in message and method is not None:
            write_message(stdout, {"jsonrpc": "2.0", "id": message["id"], "result": result})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
