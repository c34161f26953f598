"""Where the server's log records go: the client gets them at the level it asks for, stderr only
warnings and errors (editors keep all of stderr; Neovim files each line as an error)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types

from lsp_server.logging_bridge import FORWARDED, ClientLogHandler
from lsp_server.main import configure_logging
from tests.support.raw_lsp import INIT_OPTIONS, RawServer, frame, notification


class RecordingServer:
    """What the handler needs of the server: somewhere to send `window/logMessage`."""

    def __init__(self) -> None:
        self.sent: list[types.LogMessageParams] = []

    def window_log_message(self, params: types.LogMessageParams) -> None:
        self.sent.append(params)


@pytest.fixture
def root_logging() -> Iterator[None]:
    """Put the root logger back as it was after `configure_logging`."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name in ("pygls", "httpx", "httpcore", *FORWARDED):
        logging.getLogger(name).setLevel(logging.NOTSET)


async def logged(
    capsys: pytest.CaptureFixture[str], verbosity: int, log_level: str, trace: types.TraceValue
) -> tuple[list[tuple[types.MessageType, str]], str]:
    """Log one record of each level as the server's process would; what the client got, and
    what stderr got."""
    level = configure_logging(verbosity)
    server = RecordingServer()
    handler = ClientLogHandler(server, level)  # type: ignore[arg-type]
    logging.getLogger().addHandler(handler)
    handler.follow(log_level, trace)
    handler.loop = asyncio.get_running_loop()
    log = logging.getLogger("lsp_server.features.example")
    for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR):
        log.log(level, "a %s line", logging.getLevelName(level).lower())
    await asyncio.sleep(0)  # the sends were queued on this loop before this task resumes
    return [(p.type, p.message) for p in server.sent], capsys.readouterr().err


@pytest.mark.parametrize(
    ("verbosity", "log_level", "trace", "client", "stderr"),
    [
        pytest.param(
            0, "info", types.TraceValue.Off, ["info", "warning", "error"], ["warning", "error"],
            id="default",
        ),
        pytest.param(
            0, "info", types.TraceValue.Messages, ["info", "warning", "error"],
            ["warning", "error"], id="trace-messages",
        ),
        pytest.param(
            0, "info", types.TraceValue.Verbose, ["debug", "info", "warning", "error"],
            ["warning", "error"], id="trace-verbose",
        ),
        pytest.param(
            0, "warning", types.TraceValue.Off, ["warning", "error"], ["warning", "error"],
            id="logLevel-warning",
        ),
        pytest.param(
            0, "debug", types.TraceValue.Off, ["debug", "info", "warning", "error"],
            ["warning", "error"], id="logLevel-debug",
        ),
        pytest.param(
            1, "info", types.TraceValue.Off, ["info", "warning", "error"],
            ["info", "warning", "error"], id="-v",
        ),
        pytest.param(
            2, "info", types.TraceValue.Off, ["debug", "info", "warning", "error"],
            ["debug", "info", "warning", "error"], id="-vv",
        ),
        pytest.param(
            0, "error", types.TraceValue.Off, ["error"], ["error"], id="logLevel-error",
        ),
    ],
)  # fmt: skip
async def test_the_client_gets_what_it_asks_for_and_stderr_warnings_and_errors(
    capsys: pytest.CaptureFixture[str],
    root_logging: None,
    verbosity: int,
    log_level: str,
    trace: types.TraceValue,
    client: list[str],
    stderr: list[str],
) -> None:
    sent, err = await logged(capsys, verbosity, log_level, trace)
    kinds = {
        "debug": types.MessageType.Log,
        "info": types.MessageType.Info,
        "warning": types.MessageType.Warning,
        "error": types.MessageType.Error,
    }
    assert sent == [
        (kinds[name], f"{name.upper()} lsp_server.features.example: a {name} line")
        for name in client
    ]
    assert [line.split(" ")[1].lower() for line in err.splitlines()] == stderr


# -- the real server -----------------------------------------------------------------------------


def log_messages(server: RawServer) -> list[tuple[int, str]]:
    return [
        (n["params"]["type"], n["params"]["message"])
        for n in server.notifications
        if n["method"] == "window/logMessage"
    ]


def wait_for_log_message(server: RawServer, text: str, timeout_s: float = 60) -> None:
    """Read until a `window/logMessage` holding `text` has come."""
    deadline = time.monotonic() + timeout_s
    while not any(text in message for _, message in log_messages(server)):
        assert time.monotonic() < deadline, log_messages(server)
        server.call("ping", "tabloop/status")


def started(tmp_path: Path, **initialize: Any) -> RawServer:
    server = RawServer(tmp_path)
    (tmp_path / "ws").mkdir()
    server.initialize(tmp_path / "ws", **initialize)
    return server


def test_the_server_sends_info_to_the_client_and_not_to_stderr(tmp_path: Path) -> None:
    server = started(tmp_path)
    try:
        assert server.wait_settled() == "ready"
        wait_for_log_message(server, "model ready")
    finally:
        server.stop()
    assert any(
        kind == types.MessageType.Info and "model ready" in message
        for kind, message in log_messages(server)
    )
    stderr = (tmp_path / "server.log").read_text(encoding="utf-8")
    assert " INFO " not in stderr and "model ready" not in stderr, stderr


def test_cancelling_an_answered_request_leaves_stderr_alone(tmp_path: Path) -> None:
    """An editor cancels a request whose answer is already on its way: routine, not a warning
    (Neovim would file it as an error)."""
    server = started(tmp_path)
    try:
        answered = server.call("ping", "tabloop/status")
        assert answered
        server.send(frame(notification("$/cancelRequest", {"id": "ping"})))
        server.call("after", "tabloop/status")  # handled in order: the cancel came first
    finally:
        server.stop()
    stderr = (tmp_path / "server.log").read_text(encoding="utf-8")
    assert "Cancel notification" not in stderr, stderr


@pytest.mark.parametrize(
    ("initialize", "set_trace"),
    [
        pytest.param({"trace": "verbose"}, None, id="initialize"),
        pytest.param({"trace": "off"}, "verbose", id="setTrace"),
    ],
)
def test_a_verbose_trace_brings_debug_lines_to_the_client(
    tmp_path: Path, initialize: dict[str, Any], set_trace: str | None
) -> None:
    server = started(tmp_path, **initialize)
    try:
        if set_trace is not None:
            server.send(frame(notification("$/setTrace", {"value": set_trace})))
        # A malformed notification of ours is dropped with a debug line.
        server.send(frame(notification("tabloop/didShow", {})))
        wait_for_log_message(server, "ignoring malformed")
    finally:
        server.stop()
    assert any(
        kind == types.MessageType.Log and message.startswith("DEBUG ")
        for kind, message in log_messages(server)
    )


def test_loading_a_model_draws_no_progress_bar(tmp_path: Path, tiny_model_path: Path) -> None:
    """Transformers draws "Loading weights" on stderr when the torch engine loads a model
    anywhere else; the server's stderr is the editor's log."""
    server = RawServer(tmp_path)
    (tmp_path / "ws").mkdir()
    options = {**INIT_OPTIONS, "completion": {"model": str(tiny_model_path), "engine": "torch"}}
    try:
        server.initialize(tmp_path / "ws", initializationOptions=options)
        assert server.wait_settled() == "ready"
    finally:
        server.stop()
    stderr = (tmp_path / "server.log").read_text(encoding="utf-8")
    assert "Loading weights" not in stderr and "it/s]" not in stderr, stderr
