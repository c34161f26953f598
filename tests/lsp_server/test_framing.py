"""Broken framing and malformed JSON-RPC, in raw bytes against the real server over stdio.

Each case sends one bad message, then a valid request, and checks that the server lives, that
the bad message got exactly the one error response it earns (code and id), and that the valid
request is answered. The rules are in `lsp_server/framing.py` and `lsp_server/rpc.py`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lsp_server.protocol import STATUS_REQUEST
from tests.support.raw_lsp import RawServer, frame, notification, request

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
SERVER_NOT_INITIALIZED = -32002

URI = "file:///tmp/framing/example.py"


def body(msg_id: Any, method: str = STATUS_REQUEST, params: Any = None) -> bytes:
    return json.dumps(request(msg_id, method, params)).encode()


def inline(msg_id: Any, position: Any) -> bytes:
    params = {
        "textDocument": {"uri": URI},
        "position": position,
        "context": {"triggerKind": 2},
    }
    return body(msg_id, "textDocument/inlineCompletion", params)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RawServer]:
    """One initialized server for the module: each case also shows the next one is served."""
    home = tmp_path_factory.mktemp("framing")
    raw = RawServer(home)
    try:
        raw.initialize(home)
        raw.send(
            frame(
                notification(
                    "textDocument/didOpen",
                    {
                        "textDocument": {
                            "uri": URI,
                            "languageId": "python",
                            "version": 1,
                            "text": "def f():\n    return 1\n",
                        }
                    },
                )
            )
        )
        yield raw
    finally:
        raw.stop()


_next_id = iter(range(1000, 10**6))


def check(server: RawServer, bad: bytes, expected: list[tuple[int, Any]], alone: bool) -> None:
    """Send `bad`, then a valid request; `expected` errors (code, id) answer `bad`, once each."""
    follow = next(_next_id)
    if alone:
        # The bad message is answered before anything else arrives.
        server.send(bad)
        errors = server.responses(5, until_id=expected[-1][1]) if expected else []
        server.send(frame(body(follow)))
        rest = server.responses(30, until_id=follow)
    else:
        server.send(bad + frame(body(follow)))
        rest = server.responses(30, until_id=follow)
        errors = []
    found = errors + rest
    assert server.alive()
    answered = [m for m in found if m.get("id") == follow]
    assert len(answered) == 1 and "result" in answered[0], found
    others = [(m["error"]["code"], m["id"]) for m in found if m.get("id") != follow]
    assert others == expected, found
    # Nothing else trickles in late.
    assert server.responses(0.3) == []


ok = body(1)
FRAMING = [
    pytest.param(
        b"Content-Length: %d\r\n\r\n%s" % (len(ok) - 5, ok),
        [(PARSE_ERROR, None)],
        False,
        id="length-too-short",
    ),
    pytest.param(
        b"Content-Length: %d\r\n\r\n%s" % (len(ok) + 40, ok),
        [(INVALID_REQUEST, 1)],
        False,
        id="length-too-long",
    ),
    pytest.param(
        b"Content-Length: %d\r\n\r\n%s" % (len(ok) + 40, ok),
        [(INVALID_REQUEST, 1)],
        True,
        id="length-too-long-alone",
    ),
    pytest.param(
        b"Content-Length: twelve\r\n\r\n" + ok,
        [(PARSE_ERROR, None)],
        False,
        id="length-not-a-number",
    ),
    pytest.param(
        b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n" + ok,
        [(PARSE_ERROR, None)],
        False,
        id="length-header-missing",
    ),
    pytest.param(ok, [(PARSE_ERROR, None)], False, id="no-headers-at-all"),
    pytest.param(b"hello there\r\n", [(PARSE_ERROR, None)], True, id="garbage-line"),
    pytest.param(
        b"Content-Length: 100000000000\r\n\r\n" + ok,
        [(INVALID_REQUEST, None)],
        True,
        id="length-100GB",
    ),
    pytest.param(
        b"Content-Length: 100000000000\r\n\r\n" + ok,
        [(INVALID_REQUEST, None)],
        False,
        id="length-100GB-then-next-frame",
    ),
    pytest.param(
        b"Content-Length: %d\r\n\r\n" % 2**64,
        [(INVALID_REQUEST, None)],
        False,
        id="length-past-int64",
    ),
    pytest.param(
        b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n",
        [(INVALID_REQUEST, None)],
        False,
        id="length-5000-digits",
    ),
    # Accepted: LF-only line ends, lower-case header names, Content-Type, blank lines.
    pytest.param(b"Content-Length: %d\n\n%s" % (len(ok), ok), [], False, id="lf-line-ends"),
    pytest.param(
        b"content-length: %d\r\n\r\n%s" % (len(ok), ok), [], False, id="lower-case-header"
    ),
    pytest.param(
        b"\r\nContent-Type: application/vscode-jsonrpc; charset=utf-8\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(ok), ok),
        [],
        False,
        id="content-type-first",
    ),
]


@pytest.mark.parametrize(("bad", "expected", "alone"), FRAMING)
def test_framing(
    server: RawServer, bad: bytes, expected: list[tuple[int, Any]], alone: bool
) -> None:
    if not expected:
        # An accepted frame: its own request (id 1) is answered, with a result.
        server.send(bad)
        answer = server.responses(30, until_id=1)
        assert [m.get("id") for m in answer] == [1] and "result" in answer[0], answer
    check(server, bad, expected, alone) if expected else check(server, b"", [], False)


def test_oversized_body_is_skipped_not_kept(server: RawServer) -> None:
    """A real 40 MB message (over the 32 MiB default) is skipped; memory stays flat."""
    server.wait_settled()
    before = server.rss_kib()
    text = "x" * (40 * 1024 * 1024)
    big = json.dumps(
        notification(
            "textDocument/didOpen",
            {
                "textDocument": {
                    "uri": "file:///tmp/framing/big.py",
                    "languageId": "python",
                    "version": 1,
                    "text": text,
                }
            },
        )
    ).encode()
    check(server, frame(big), [(INVALID_REQUEST, None)], False)
    assert server.rss_kib() - before < 30 * 1024


MESSAGES = [
    pytest.param(
        inline(21, {"line": -1, "character": 0}), [(INVALID_PARAMS, 21)], id="line-negative"
    ),
    pytest.param(
        inline(22, {"line": 2**31, "character": 0}), [(INVALID_PARAMS, 22)], id="line-past-int32"
    ),
    pytest.param(
        inline("s-23", {"line": "one", "character": 0}),
        [(INVALID_PARAMS, "s-23")],
        id="line-a-string",
    ),
    pytest.param(
        body(24, "textDocument/inlineCompletion", None), [(INVALID_PARAMS, 24)], id="params-missing"
    ),
    pytest.param(
        json.dumps({**request(25, STATUS_REQUEST), "params": "x"}).encode(),
        [(INVALID_PARAMS, 25)],
        id="params-a-string",
    ),
    pytest.param(
        b'{"jsonrpc": "2.0", "id": 26, "method": ', [(PARSE_ERROR, None)], id="json-cut-short"
    ),
    pytest.param(b"[" * 100000, [(PARSE_ERROR, None)], id="json-nested-too-deep"),
    pytest.param(b"[]", [(INVALID_REQUEST, None)], id="batch"),
    pytest.param(
        json.dumps({"id": 27, "method": STATUS_REQUEST}).encode(),
        [(INVALID_REQUEST, 27)],
        id="jsonrpc-missing",
    ),
    pytest.param(
        json.dumps({"jsonrpc": "1.0", "id": 28, "method": STATUS_REQUEST}).encode(),
        [(INVALID_REQUEST, 28)],
        id="jsonrpc-1.0",
    ),
    pytest.param(
        json.dumps(request(29.5, STATUS_REQUEST)).encode(),
        [(INVALID_REQUEST, None)],
        id="id-a-float",
    ),
    pytest.param(
        json.dumps(request({"a": 1}, STATUS_REQUEST)).encode(),
        [(INVALID_REQUEST, None)],
        id="id-an-object",
    ),
    pytest.param(
        json.dumps(request(None, STATUS_REQUEST)).encode(), [(INVALID_REQUEST, None)], id="id-null"
    ),
    pytest.param(
        json.dumps({"jsonrpc": "2.0", "id": 30, "method": 7}).encode(),
        [(INVALID_REQUEST, 30)],
        id="method-a-number",
    ),
    pytest.param(
        json.dumps({"jsonrpc": "2.0", "id": 31}).encode(),
        [(INVALID_REQUEST, 31)],
        id="no-method-no-result",
    ),
    pytest.param(body(32, "no/suchMethod"), [(METHOD_NOT_FOUND, 32)], id="unknown-method"),
    pytest.param(
        body(33, "window/showMessage", {"type": 1, "message": "hi"}),
        [(METHOD_NOT_FOUND, 33)],
        id="notification-sent-as-request",
    ),
    pytest.param(
        json.dumps({**request(34, STATUS_REQUEST), "error": 1}).encode(),
        [],
        id="request-with-stray-error-field",
    ),
    pytest.param(
        json.dumps(notification("$/cancelRequest", {"id": [1, 2]})).encode(),
        [],
        id="cancel-with-a-list-id",
    ),
    pytest.param(
        json.dumps(notification("textDocument/didOpen", {"bad": 1})).encode(),
        [],
        id="notification-bad-params-dropped",
    ),
]


@pytest.mark.parametrize(("message", "expected"), MESSAGES)
def test_messages(server: RawServer, message: bytes, expected: list[tuple[int, Any]]) -> None:
    if not expected and "id" in json.loads(message):
        server.send(frame(message))
        msg_id = json.loads(message)["id"]
        answer = server.responses(30, until_id=msg_id)
        assert len(answer) == 1 and "result" in answer[0], answer
        return
    check(server, frame(message), expected, False)


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[RawServer]:
    raw = RawServer(tmp_path)
    try:
        yield raw
    finally:
        raw.stop()


def test_request_before_initialize(fresh: RawServer, tmp_path: Path) -> None:
    early = fresh.call(1, STATUS_REQUEST)
    assert early["error"]["code"] == SERVER_NOT_INITIALIZED
    fresh.initialize(tmp_path)
    assert "result" in fresh.call(2, STATUS_REQUEST)


def test_second_initialize_is_refused_and_changes_nothing(fresh: RawServer, tmp_path: Path) -> None:
    fresh.initialize(tmp_path)
    before = fresh.call(1, STATUS_REQUEST)["result"]
    again = fresh.call(
        2,
        "initialize",
        {
            "processId": None,
            "rootUri": None,
            "capabilities": {},
            "initializationOptions": {"telemetry": {"level": "anonymous"}, "logLevel": "debug"},
        },
    )
    assert again["error"]["code"] == INVALID_REQUEST
    after = fresh.call(3, STATUS_REQUEST)["result"]
    assert after["telemetry"]["level"] == before["telemetry"]["level"] == "off"


def test_requests_after_shutdown_are_refused(fresh: RawServer, tmp_path: Path) -> None:
    fresh.initialize(tmp_path)
    assert "result" in fresh.call(1, "shutdown")
    late = fresh.call(2, STATUS_REQUEST)
    assert late["error"]["code"] == INVALID_REQUEST
    assert fresh.call(3, "shutdown")["error"]["code"] == INVALID_REQUEST
    fresh.send(frame(notification("exit")))
    fresh.process.wait(timeout=10)
