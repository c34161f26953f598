"""Next edits through the real server over stdio, with a scripted model and a real backend.

The server calls a loopback OpenAI-compatible server whose model answers each next-edit prompt
by the document's path (the prompt ends `<|file_sep|>updated/{path}`), so every rewrite is known
beforehand; its telemetry goes to a real backend on loopback at level `metrics`. Each case
opens a document, edits it over `didChange` as an editor would, and asks for the next edit.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from evaluation.lsp_client import plain
from lsp_server.protocol import (
    ACCEPT_NEXT_EDIT_COMMAND,
    DID_SHOW_INLINE_EDIT_NOTIFICATION,
    NEXT_EDIT_REJECTED_NOTIFICATION,
    NEXT_EDIT_REQUEST,
    NEXT_EDIT_TIMINGS_REQUEST,
    TABLOOP_NEXT_EDIT_REQUEST,
)
from tests.lsp_server.test_e2e import wait_until_ready
from tests.support.backend_server import BackendServer
from tests.support.completion_server import serve_completions
from tests.support.scripted_model import ScriptedModel

pytestmark = pytest.mark.asyncio(loop_scope="module")

SOURCE = """\
def area(width, height):
    return width * height


def show(width, height):
    print(area(width, height))
"""
# The user renames `width` to `w` on line 0; the model renames its use on line 1 too.
RENAMED = SOURCE.replace("area(width, height):", "area(w, height):")
PREDICTED = RENAMED.replace("return width * height", "return w * height")
FILE_SEP = "<|file_sep|>"
WINDOW_TOKENS = 64  # the window's budget (the HTTP runner counts 3 bytes a token)
# Lines each past the window's budget: a window ends before them.
FILLER = [f"value_{n} = '{'z' * 200}'\n" for n in range(10)]
MODEL = ScriptedModel(
    rules={
        "updated/rename.py\n": PREDICTED + FILE_SEP,
        "updated/second.py\n": PREDICTED + FILE_SEP,
        "updated/undo.py\n": SOURCE + FILE_SEP,  # puts the user's edit back
        # Rewrites the window and carries on with the document's line after it.
        "updated/outside.py\n": "".join(PREDICTED.splitlines(keepends=True)[:4])
        + FILLER[0]
        + FILE_SEP,
        "updated/big.py\n": PREDICTED + FILE_SEP,
        "updated/batch.py\n": PREDICTED + FILE_SEP,
        "updated/whole.py\n": PREDICTED + FILE_SEP,
    }
)


@pytest.fixture(scope="module")
def model_url() -> Iterator[str]:
    with serve_completions(MODEL) as (url, _):
        yield url


@pytest.fixture(scope="module")
def telemetry_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendServer]:
    db = tmp_path_factory.mktemp("backend") / "backend.sqlite3"
    with BackendServer(f"sqlite:///{db}") as backend:
        yield backend


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ws")


SERVER = ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server", "--stdio"])


async def start_server(
    lsp_client: LanguageClient,
    workspace: Path,
    cache: Path,
    model_url: str,
    next_edit: dict[str, Any],
    telemetry: dict[str, Any],
) -> types.InitializeResult:
    """Initialize the server on the scripted model at `model_url`, the index off, and wait
    until its model is ready."""
    options = {
        "cacheDir": str(cache),
        "completion": {
            "runner": "http",
            "httpUrl": model_url,
            "httpModel": "scripted",
            "fimTemplate": "qwen",
        },
        "nextEdit": next_edit,
        "index": {"enabled": False},
        "telemetry": telemetry,
    }
    result = await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=types.ClientCapabilities(),
            root_uri=workspace.as_uri(),
            initialization_options=options,
        )
    )
    status = await wait_until_ready(lsp_client)
    assert status["model"]["state"] == "ready", status
    return result


@pytest_lsp.fixture(config=SERVER, scope="module")
async def client(
    lsp_client: LanguageClient,
    model_url: str,
    workspace: Path,
    telemetry_backend: BackendServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[None]:
    # Generous: the scripted model's pieces outnumber the HTTP runner's token estimate.
    # The model path is tested here: the screen (tests of its own) asks it every time.
    # Computing ahead has its module (`test_next_edit_prefetch_e2e`): here each model call
    # is a request's.
    next_edit = {
        "windowTokens": WINDOW_TOKENS,
        "marginTokens": 512,
        "screenBelow": 0,
        "prefetch": False,
    }
    telemetry = {
        "level": "metrics",
        "backendUrl": telemetry_backend.url,
        "token": telemetry_backend.token,
        "flushIntervalS": 0.1,
    }
    cache = tmp_path_factory.mktemp("cache")
    result = await start_server(lsp_client, workspace, cache, model_url, next_edit, telemetry)
    lsp_client.initialize_result = result  # type: ignore[attr-defined]
    yield
    await lsp_client.shutdown_session()


async def status_of(client: LanguageClient) -> dict[str, Any]:
    return plain(await client.protocol.send_request_async("tabloop/status", {}))


def partial(line: int, start: int, end: int, text: str) -> types.TextDocumentContentChangePartial:
    """An edit of `line` from column `start` to `end`."""
    return types.TextDocumentContentChangePartial(
        range=types.Range(start=types.Position(line, start), end=types.Position(line, end)),
        text=text,
    )


class Document:
    """One open document and the edits the test makes to it."""

    def __init__(self, client: LanguageClient, workspace: Path, name: str, text: str) -> None:
        self.client = client
        self.uri = (workspace / name).as_uri()
        self.version = 1
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(
                    uri=self.uri, language_id="python", version=1, text=text
                )
            )
        )

    def edit(self, line: int, start: int, end: int, text: str) -> None:
        self.change(partial(line, start, end, text))

    def change(self, *changes: types.TextDocumentContentChangeEvent) -> None:
        """One `didChange` with `changes`, applied one after the other."""
        self.version += 1
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(
                    uri=self.uri, version=self.version
                ),
                content_changes=list(changes),
            )
        )

    def rename_width(self) -> None:
        """Type over `width` on line 0 with `w`, as an editor sends it."""
        self.edit(0, 9, 14, "w")

    async def ask(
        self,
        line: int = 0,
        character: int = 10,
        *,
        method: str = NEXT_EDIT_REQUEST,
        version: int | None = None,
    ) -> list[dict[str, Any]]:
        answer = plain(
            await self.client.protocol.send_request_async(
                method,
                {
                    "textDocument": {"uri": self.uri, "version": version or self.version},
                    "position": {"line": line, "character": character},
                    "context": {"triggerKind": 2},
                },
            )
        )
        edits: list[dict[str, Any]] = answer["edits"]
        return edits


async def last_timing(client: LanguageClient) -> dict[str, Any]:
    timings = plain(await client.protocol.send_request_async(NEXT_EDIT_TIMINGS_REQUEST, {}))
    return timings[-1]


async def test_initialize_advertises_next_edits(client: LanguageClient) -> None:
    result: types.InitializeResult = client.initialize_result  # type: ignore[attr-defined]
    assert result.capabilities.experimental == {"tabloop": {"nextEdit": True}}
    command = result.capabilities.execute_command_provider
    assert command is not None and ACCEPT_NEXT_EDIT_COMMAND in command.commands


async def test_a_rename_predicts_the_matching_edit_from_the_didchange_history(
    client: LanguageClient, workspace: Path
) -> None:
    document = Document(client, workspace, "rename.py", SOURCE)
    document.rename_width()
    calls = len(MODEL.prompts)
    for method in (NEXT_EDIT_REQUEST, TABLOOP_NEXT_EDIT_REQUEST):
        edits = await document.ask(method=method)
        assert len(edits) == 1
        (item,) = edits
        # "    return width * height": "idth" deleted after "w".
        assert item["range"] == {
            "start": {"line": 1, "character": 12},
            "end": {"line": 1, "character": 16},
        }
        assert item["text"] == ""
        assert item["textDocument"] == {"uri": document.uri, "version": document.version}
        assert item["command"]["command"] == ACCEPT_NEXT_EDIT_COMMAND
        assert item["command"]["arguments"] == [item["id"]]
    prompt = MODEL.prompts[calls]
    # The history the server built from didChange: the edit's region before and after.
    assert prompt.startswith(f"{FILE_SEP}rename.py.diff\noriginal:\ndef area(width, height):")
    assert "updated:\ndef area(w, height):\n    return width * height\n" in prompt
    assert f"{FILE_SEP}original/rename.py\n{SOURCE}{FILE_SEP}current/rename.py\n{RENAMED}" in prompt
    timing = await last_timing(client)
    assert (timing["outcome"], timing["reached_model"], timing["edits"]) == ("shown", True, 1)
    assert timing["screen"] is None  # the screen is off in this module (until its own test)


def history_of(prompt: str, path: str) -> str:
    """The prompt's history blocks for `path` (before the window)."""
    start = prompt.index(f"{FILE_SEP}{path}.diff\n")
    return prompt[start : prompt.index(f"{FILE_SEP}original/{path}\n")]


def rename_history(path: str) -> str:
    """The history block of `rename_width` in `path`: the region before it and after it."""
    return (
        f"{FILE_SEP}{path}.diff\noriginal:\ndef area(width, height):\n"
        "    return width * height\n\n"
        "updated:\ndef area(w, height):\n    return width * height\n\n"
    )


async def test_the_changes_of_one_didchange_are_recorded_one_after_the_other(
    client: LanguageClient, workspace: Path
) -> None:
    # Neovim's `cw` then `w`: one didChange deletes "width", then inserts "w" where it was.
    document = Document(client, workspace, "batch.py", SOURCE)
    document.change(partial(0, 9, 14, ""), partial(0, 9, 9, "w"))
    calls = len(MODEL.prompts)
    assert len(await document.ask()) == 1
    assert history_of(MODEL.prompts[calls], "batch.py") == rename_history("batch.py")


async def test_a_whole_text_change_is_recorded_as_the_edit_it_makes(
    client: LanguageClient, workspace: Path
) -> None:
    document = Document(client, workspace, "whole.py", SOURCE)
    document.change(types.TextDocumentContentChangeWholeDocument(text=RENAMED))
    calls = len(MODEL.prompts)
    assert len(await document.ask()) == 1
    assert history_of(MODEL.prompts[calls], "whole.py") == rename_history("whole.py")
    # A change that rewrites more than a history block holds forgets the document's history.
    document.change(types.TextDocumentContentChangeWholeDocument(text="x = 1\n" * 2000))
    assert await document.ask() == []
    assert (await last_timing(client))["reason"] == "no_history"


async def test_show_accept_and_reject_are_recorded(
    client: LanguageClient, workspace: Path, telemetry_backend: BackendServer
) -> None:
    document = Document(client, workspace, "second.py", SOURCE)
    document.rename_width()
    (accepted,) = await document.ask()
    client.protocol.notify(DID_SHOW_INLINE_EDIT_NOTIFICATION, {"item": accepted})
    await client.workspace_execute_command_async(
        types.ExecuteCommandParams(
            command=ACCEPT_NEXT_EDIT_COMMAND, arguments=accepted["command"]["arguments"]
        )
    )
    document.edit(1, 12, 16, "")  # the editor applies it
    document.edit(0, 9, 10, "size")  # and the user renames again
    (rejected,) = await document.ask()
    assert rejected["id"] != accepted["id"]
    client.protocol.notify(DID_SHOW_INLINE_EDIT_NOTIFICATION, {"item": rejected})
    client.protocol.notify(
        NEXT_EDIT_REJECTED_NOTIFICATION, {"id": rejected["id"], "reason": "typed"}
    )
    deadline = time.monotonic() + 30
    wanted = {"shown": 2, "accepted": 1, "rejected": 1}
    while telemetry_backend.summary()["next_edits"] != wanted and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert telemetry_backend.summary()["next_edits"] == wanted
    status = (await status_of(client))["nextEdit"]
    assert (status["shown"], status["accepted"], status["rejected"]) == (2, 1, 1)
    # Next edits are not the gate's decisions.
    assert telemetry_backend.summary()["decisions"] == {}


async def test_a_stale_version_is_answered_empty(client: LanguageClient, workspace: Path) -> None:
    document = Document(client, workspace, "rename.py", SOURCE)
    document.rename_width()
    calls = len(MODEL.prompts)
    assert await document.ask(version=document.version - 1) == []
    assert (await last_timing(client))["outcome"] == "stale"
    assert len(MODEL.prompts) == calls


async def test_no_recent_edit_near_the_cursor_is_no_change_without_the_model(
    client: LanguageClient, workspace: Path
) -> None:
    calls = len(MODEL.prompts)
    untouched = Document(client, workspace, "untouched.py", SOURCE)
    assert await untouched.ask() == []
    far = Document(client, workspace, "far.py", SOURCE + "\n" * 60 + "x = 1\n")
    far.edit(0, 0, 0, "#")
    assert await far.ask(line=65, character=0) == []
    timing = await last_timing(client)
    assert (timing["outcome"], timing["reason"], timing["reached_model"]) == (
        "no_change",
        "no_recent_edit",
        False,
    )
    assert len(MODEL.prompts) == calls


async def test_an_undo_of_the_last_edit_is_never_shown(
    client: LanguageClient, workspace: Path
) -> None:
    document = Document(client, workspace, "undo.py", SOURCE)
    document.rename_width()
    assert await document.ask() == []
    timing = await last_timing(client)
    assert (timing["outcome"], timing["reason"]) == ("refused", "undo")


async def test_a_rewrite_past_the_window_is_never_shown(
    client: LanguageClient, workspace: Path
) -> None:
    # Long lines below: the window shrinks to the cursor's line and the three after it.
    text = "".join(SOURCE.splitlines(keepends=True)[:4]) + "".join(FILLER)
    document = Document(client, workspace, "outside.py", text)
    document.rename_width()
    assert await document.ask() == []
    timing = await last_timing(client)
    assert (timing["outcome"], timing["reason"], timing["window_lines"]) == (
        "refused",
        "outside_window",
        4,
    )


async def test_a_5mb_document_with_very_long_lines_stays_bounded(
    client: LanguageClient, workspace: Path
) -> None:
    long_line = "payload = '" + "q" * 200_000 + "'\n"  # far past any window's budget
    body = "value = compute(1, 2, 3)  # a filler line\n" * 120_000
    text = SOURCE + long_line + body
    assert len(text) > 5_000_000
    document = Document(client, workspace, "big.py", text)
    document.rename_width()
    started = time.monotonic()
    edits = await document.ask()
    assert time.monotonic() - started < 30  # not stuck (the bound is the window, below)
    assert [(e["range"]["start"]["line"], e["text"]) for e in edits] == [(1, "")]
    timing = await last_timing(client)
    # The window stops before the long line (line 6), and the prompt holds no more than it.
    assert timing["window_lines"] == 6
    assert timing["window_tokens"] <= WINDOW_TOKENS
    assert timing["prompt_tokens"] < 1000
    # An edit far down the document: the window there is its own lines only.
    document.edit(100_000, 0, 5, "total")
    far = await document.ask(line=100_000, character=3)
    # (The scripted model writes its one rewrite there too: whatever it is, it stays inside.)
    assert all(
        100_000 - 10 <= e["range"]["start"]["line"] <= e["range"]["end"]["line"] <= 100_000 + 11
        for e in far
    )
    timing = await last_timing(client)
    assert timing["window_tokens"] <= WINDOW_TOKENS and timing["prompt_tokens"] < 1000


async def wait_for_model_call(calls: int, model: ScriptedModel = MODEL) -> None:
    """Until the scripted model has been asked more than `calls` times (seconds at most)."""
    deadline = time.monotonic() + 30
    while len(model.prompts) <= calls and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert len(model.prompts) > calls


async def test_a_newer_request_or_an_inline_request_cancels_the_one_in_flight(
    client: LanguageClient, workspace: Path
) -> None:
    document = Document(client, workspace, "rename.py", SOURCE)
    document.rename_width()
    MODEL.token_delay_s = 0.2  # a slow model: each rewrite takes seconds
    try:
        calls = len(MODEL.prompts)
        first = asyncio.ensure_future(document.ask())
        await wait_for_model_call(calls)
        MODEL.token_delay_s = 0.0
        second = await document.ask()
        assert await first == []
        assert len(second) == 1
        timings = plain(await client.protocol.send_request_async(NEXT_EDIT_TIMINGS_REQUEST, {}))
        assert [t["outcome"] for t in timings[-2:]] == ["cancelled", "shown"]

        MODEL.token_delay_s = 0.2
        calls = len(MODEL.prompts)
        document.edit(0, 9, 10, "size")  # a new prompt: the last one's rewrite is kept
        pending = asyncio.ensure_future(document.ask())
        await wait_for_model_call(calls)
        await client.text_document_inline_completion_async(
            types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri=document.uri),
                position=types.Position(1, 4),
                context=types.InlineCompletionContext(
                    trigger_kind=types.InlineCompletionTriggerKind.Invoked
                ),
            )
        )
        assert await pending == []
        assert (await last_timing(client))["outcome"] == "cancelled"
    finally:
        MODEL.token_delay_s = 0.0


async def test_below_the_screens_threshold_the_model_is_not_asked(
    client: LanguageClient, workspace: Path
) -> None:
    """Last in the module: the settings pushed here stay (a client without
    `workspace/configuration` pushes its settings once)."""
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"tabloop": {"nextEdit": {"screenBelow": 1}}})
    )
    document = Document(client, workspace, "screened.py", SOURCE)
    document.rename_width()
    for _ in range(100):  # until the settings apply (before, the model answers as above)
        calls = len(MODEL.prompts)
        edits = await document.ask()
        timing = await last_timing(client)
        if timing["reason"] == "unlikely":
            break
        await asyncio.sleep(0.05)
    assert edits == []
    assert (timing["outcome"], timing["reason"], timing["reached_model"]) == (
        "no_change",
        "unlikely",
        False,
    )
    assert 0 < timing["screen"] < 1 and timing["screen_ms"] > 0
    assert len(MODEL.prompts) == calls
