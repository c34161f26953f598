"""The real server over stdio, driven by pytest-lsp with recorded client capability profiles.

These tests are about the protocol (items, ranges, commands, cancellation, settings, the
completion fallback), so the model is scripted: the server calls a loopback OpenAI-compatible
server (`completion.runner = "http"`) whose answers the tests choose. What the real tiny model
does end to end is tested in `test_tiny_model_e2e.py`.
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
from pygls.exceptions import JsonRpcRequestCancelled
from pytest_lsp import ClientServerConfig, LanguageClient

from evaluation.lsp_client import plain
from lsp_server.protocol import TIMINGS_REQUEST
from tests.lsp_server.conftest import PROFILES, load_profile
from tests.support.completion_server import serve_completions
from tests.support.scripted_model import ScriptedModel, code_before_cursor

# A real function, mid-typing: the cursor is after "    result = " on its line.
SOURCE = '''\
import os


def join_words(words, separator=" "):
    """Join words with a separator, skipping empty ones."""
    kept = [word for word in words if word]
    result = {CURSOR_MARK}
    return result


def count_lines(path):
    with open(path) as handle:
        return sum(1 for _ in handle)
'''
SOURCE = SOURCE.replace("{CURSOR_MARK}", "")
pytestmark = pytest.mark.asyncio(loop_scope="module")
CURSOR = types.Position(line=6, character=13)
# What the scripted model says after "    result = " (and, for any other prompt, nothing).
SUGGESTION = "separator.join(kept)"


# A second file, for the cancellation test: the model is slow there.
SLOW_SOURCE = "def total(values):\n    result = 0\n    total = \n    return total\n"
SLOW_CURSOR = types.Position(line=2, character=12)
SLOW_SUGGESTION = "sum(value for value in values if value is not None)"


@pytest.fixture(scope="module")
def scripted_model() -> ScriptedModel:
    return ScriptedModel(rules={"    result = ": SUGGESTION, "    total = ": SLOW_SUGGESTION})


@pytest.fixture(scope="module")
def model_url(scripted_model: ScriptedModel) -> Iterator[str]:
    """Base URL of a loopback completion server serving `scripted_model`."""
    with serve_completions(scripted_model) as (url, _):
        yield url


def init_options(model_url: str, cache_dir: Path, **completion: Any) -> dict[str, Any]:
    return {
        "cacheDir": str(cache_dir),
        "completion": {
            "runner": "http",
            "httpUrl": model_url,
            "httpModel": "scripted",
            "fimTemplate": "qwen",
            "maxNewTokens": 24,
            **completion,
        },
        # Always show a non-empty suggestion: these tests are about the protocol, not the policy.
        "policy": {"showFloor": 1.0},
        "index": {"enabled": False},
        "telemetry": {"level": "off"},
    }


async def wait_until_ready(client: LanguageClient, timeout_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        status: dict[str, Any] = plain(
            await client.protocol.send_request_async("tabloop/status", {})
        )
        if status["model"]["state"] != "loading" or time.monotonic() > deadline:
            return status
        await asyncio.sleep(0.1)


def open_document(client: LanguageClient, path: Path, text: str = SOURCE) -> str:
    uri = path.as_uri()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(
                uri=uri, language_id="python", version=1, text=text
            )
        )
    )
    return uri


def inline_params(uri: str, position: types.Position = CURSOR) -> types.InlineCompletionParams:
    return types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=position,
        context=types.InlineCompletionContext(
            trigger_kind=types.InlineCompletionTriggerKind.Automatic
        ),
    )


@pytest.fixture(scope="module")
def server_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("workspace")
    (root / "words.py").write_text(SOURCE, encoding="utf-8")
    return root


SERVER = ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server", "--stdio"])


# One server per profile for the whole module: starting torch and a model per test is slow.
@pytest_lsp.fixture(config=SERVER, params=sorted(PROFILES), scope="module")
async def client(
    lsp_client: LanguageClient,
    request: pytest.FixtureRequest,
    model_url: str,
    server_workspace: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[None]:
    profile = load_profile(request.param)
    params = types.InitializeParams(
        capabilities=profile.capabilities,
        client_info=profile.client_info,
        root_uri=server_workspace.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=server_workspace.as_uri(), name="ws")],
        initialization_options=init_options(model_url, tmp_path_factory.mktemp("cache")),
    )
    result = await lsp_client.initialize_session(params)
    lsp_client.initialize_result = result  # type: ignore[attr-defined]
    lsp_client.workspace_for_tests = server_workspace  # type: ignore[attr-defined]
    yield
    await lsp_client.shutdown_session()


async def test_initialize_advertises_features_and_answers_before_the_model(
    client: LanguageClient,
) -> None:
    result: types.InitializeResult = client.initialize_result  # type: ignore[attr-defined]
    capabilities = result.capabilities
    assert result.server_info is not None and result.server_info.name == "tabloop"
    assert capabilities.inline_completion_provider
    assert capabilities.completion_provider is not None
    assert capabilities.execute_command_provider is not None
    assert "tabloop.accept" in capabilities.execute_command_provider.commands
    # This test runs first on a fresh server: the model is still loading in the background, and
    # a request now is answered at once, empty, rather than waiting for it.
    uri = open_document(client, client.workspace_for_tests / "words.py")  # type: ignore[attr-defined]
    answer = await client.text_document_inline_completion_async(inline_params(uri))
    status = plain(await client.protocol.send_request_async("tabloop/status", {}))
    assert isinstance(answer, types.InlineCompletionList)
    if status["model"]["state"] == "loading":
        assert not answer.items


async def test_inline_completion_suggests_with_an_accept_command(
    client: LanguageClient, server_workspace: Path
) -> None:
    assert (await wait_until_ready(client))["model"]["state"] == "ready"
    uri = open_document(client, server_workspace / "words.py")
    answer = await client.text_document_inline_completion_async(inline_params(uri))
    assert isinstance(answer, types.InlineCompletionList)
    assert len(answer.items) == 1
    item = answer.items[0]
    assert item.insert_text == SUGGESTION
    assert item.range == types.Range(start=CURSOR, end=CURSOR)
    assert item.command is not None and item.command.command == "tabloop.accept"
    assert item.command.arguments and isinstance(item.command.arguments[0], str)


async def test_accept_command_is_recorded(client: LanguageClient, server_workspace: Path) -> None:
    await wait_until_ready(client)
    uri = open_document(client, server_workspace / "words.py")
    answer = await client.text_document_inline_completion_async(inline_params(uri))
    assert isinstance(answer, types.InlineCompletionList) and answer.items
    command = answer.items[0].command
    assert command is not None
    before = plain(await client.protocol.send_request_async("tabloop/status", {}))
    await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=command.command, arguments=command.arguments)
    )
    after = plain(await client.protocol.send_request_async("tabloop/status", {}))
    assert after["decisions"]["accepted"] == before["decisions"]["accepted"] + 1
    assert after["decisions"]["shown"] >= 1


async def test_cancelled_request_then_the_next_one_works(
    client: LanguageClient, server_workspace: Path, scripted_model: ScriptedModel
) -> None:
    await wait_until_ready(client)
    # A file of its own, so that no earlier answer is in the typing cache, and a slow model, so
    # that the cancellation arrives while the model is generating.
    uri = open_document(client, server_workspace / "totals.py", SLOW_SOURCE)
    scripted_model.token_delay_s = 0.2
    asked = len(scripted_model.prompts)
    try:
        msg_id = f"cancel-me-{uri}"
        # A task, so that the request is sent now rather than when it is awaited.
        pending = asyncio.ensure_future(
            client.protocol.send_request_async(
                types.TEXT_DOCUMENT_INLINE_COMPLETION,
                inline_params(uri, SLOW_CURSOR),
                msg_id=msg_id,
            )
        )
        deadline = time.monotonic() + 60
        while not any(  # the request has reached the model, which needs seconds
            scripted_model.answer_for(prompt) == SLOW_SUGGESTION
            for prompt in scripted_model.prompts[asked:]
        ):
            assert time.monotonic() < deadline, "the request never reached the model"
            await asyncio.sleep(0.01)
        client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))
        with pytest.raises(JsonRpcRequestCancelled):
            await pending
    finally:
        scripted_model.token_delay_s = 0.0
    answer = await client.text_document_inline_completion_async(inline_params(uri, SLOW_CURSOR))
    assert isinstance(answer, types.InlineCompletionList) and len(answer.items) == 1
    assert answer.items[0].insert_text == SLOW_SUGGESTION


# Form feed, U+2028 and U+0085 are not LSP line breaks; the cursor is past the end of the
# unterminated last line, which LSP says means its end.
ODD_BREAKS_SOURCE = "page = 1\f\nmark\u2028 = 2 \x85 # note\n    result = "
ODD_BREAKS_CURSOR = types.Position(line=2, character=40)


async def test_the_model_sees_the_text_before_the_lsp_position(
    client: LanguageClient, server_workspace: Path, scripted_model: ScriptedModel
) -> None:
    await wait_until_ready(client)
    uri = open_document(client, server_workspace / "breaks.py", ODD_BREAKS_SOURCE)
    asked = len(scripted_model.prompts)
    answer = await client.text_document_inline_completion_async(
        inline_params(uri, ODD_BREAKS_CURSOR)
    )
    assert isinstance(answer, types.InlineCompletionList) and len(answer.items) == 1
    assert answer.items[0].insert_text == SUGGESTION
    # The request's own prompt; the prefetch for the cursor after accepting the suggestion may
    # already have added its own (the same text followed by the suggestion).
    before = [code_before_cursor(prompt) for prompt in scripted_model.prompts[asked:]]
    assert any(text.endswith(ODD_BREAKS_SOURCE) for text in before), before


@pytest.mark.parametrize("path", ["/etc/passwd", "on-disk-only.py"])
async def test_completion_on_an_unopened_file_answers_empty_and_reads_nothing(
    client: LanguageClient, server_workspace: Path, scripted_model: ScriptedModel, path: str
) -> None:
    await wait_until_ready(client)
    # A file the editor never opened, which the scripted model would complete if it were read.
    on_disk = server_workspace / "on-disk-only.py"
    on_disk.write_text("secret_marker = 42\n    result = ", encoding="utf-8")
    target = Path(path) if path.startswith("/") else on_disk
    asked = len(scripted_model.prompts)
    answer = await client.text_document_inline_completion_async(
        inline_params(target.as_uri(), types.Position(line=1, character=13))
    )
    assert isinstance(answer, types.InlineCompletionList) and not answer.items
    sent = "".join(scripted_model.prompts[asked:])
    assert "secret_marker" not in sent and "root:" not in sent


@pytest_lsp.fixture(config=SERVER, scope="module")
async def legacy_client(
    lsp_client: LanguageClient,
    model_url: str,
    server_workspace: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[None]:
    """A client without inline completion (Neovim 0.11's capabilities minus the 0.12 feature)."""
    profile = load_profile("neovim-0.12")
    assert profile.capabilities.text_document is not None
    profile.capabilities.text_document.inline_completion = None
    await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=profile.capabilities,
            root_uri=server_workspace.as_uri(),
            initialization_options=init_options(model_url, tmp_path_factory.mktemp("cache")),
        )
    )
    yield
    await lsp_client.shutdown_session()


async def test_completion_fallback_offers_the_same_suggestion(
    legacy_client: LanguageClient, server_workspace: Path
) -> None:
    client = legacy_client
    await wait_until_ready(client)
    uri = open_document(client, server_workspace / "words.py")
    result = await client.text_document_completion_async(
        types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=CURSOR,
            context=types.CompletionContext(trigger_kind=types.CompletionTriggerKind.Invoked),
        )
    )
    assert isinstance(result, types.CompletionList)
    assert len(result.items) == 1
    item = result.items[0]
    assert isinstance(item.text_edit, types.TextEdit)
    assert item.text_edit.new_text == SUGGESTION
    assert item.text_edit.range == types.Range(start=CURSOR, end=CURSOR)
    assert item.command is not None and item.command.command == "tabloop.accept"
    # The inline answer at the same place is the same text (served from the typing cache).
    inline = await client.text_document_inline_completion_async(inline_params(uri))
    assert isinstance(inline, types.InlineCompletionList) and inline.items
    assert inline.items[0].insert_text == item.text_edit.new_text


@pytest_lsp.fixture(config=SERVER, scope="module")
async def misconfigured_client(
    lsp_client: LanguageClient,
    model_url: str,
    server_workspace: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[None]:
    options = init_options(model_url, tmp_path_factory.mktemp("cache"))
    options["completion"]["maxNewTokens"] = -5
    options["completion"]["temprature"] = 0.2
    await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=load_profile("vscode").capabilities,
            root_uri=server_workspace.as_uri(),
            initialization_options=options,
        )
    )
    yield
    await lsp_client.shutdown_session()


async def test_invalid_settings_are_shown_once_and_the_server_keeps_running(
    misconfigured_client: LanguageClient, server_workspace: Path
) -> None:
    client = misconfigured_client
    status = await wait_until_ready(client)
    assert status["model"]["state"] == "ready"
    warnings = [m for m in client.messages if "configuration" in m.message]
    assert len(warnings) == 1
    assert "maxNewTokens" in warnings[0].message and "temprature" in warnings[0].message
    uri = open_document(client, server_workspace / "words.py")
    answer = await client.text_document_inline_completion_async(inline_params(uri))
    assert isinstance(answer, types.InlineCompletionList) and len(answer.items) == 1
    assert answer.items[0].insert_text == SUGGESTION


async def test_each_request_leaves_one_timing_record_of_its_own(
    client: LanguageClient, server_workspace: Path, scripted_model: ScriptedModel
) -> None:
    """A cancelled request, a shown one and one on an unopened file: each is recorded once,
    under its own id, with how it ended (benchmarks read each request's record by its id)."""
    await wait_until_ready(client)
    source = "# timed\n" + SLOW_SOURCE  # no earlier answer for this text in the typing cache
    cursor = types.Position(line=SLOW_CURSOR.line + 1, character=SLOW_CURSOR.character)
    uri = open_document(client, server_workspace / "timed.py", source)
    asked = len(scripted_model.prompts)
    scripted_model.token_delay_s = 0.2
    try:
        pending = asyncio.ensure_future(
            client.protocol.send_request_async(
                types.TEXT_DOCUMENT_INLINE_COMPLETION,
                inline_params(uri, cursor),
                msg_id="timed-cancelled",
            )
        )
        deadline = time.monotonic() + 30  # not stuck
        while len(scripted_model.prompts) == asked and time.monotonic() < deadline:
            await asyncio.sleep(0.01)  # until the model has the prompt
        client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="timed-cancelled"))
        with pytest.raises(JsonRpcRequestCancelled):
            await pending
    finally:
        scripted_model.token_delay_s = 0.0
    for msg_id, target in (
        ("timed-shown", uri),
        ("timed-unopened", (server_workspace / "never-opened.py").as_uri()),
    ):
        await client.protocol.send_request_async(
            types.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(target, cursor), msg_id=msg_id
        )
    timings = plain(await client.protocol.send_request_async(TIMINGS_REQUEST, {}))
    mine = [t for t in timings if t["request_id"].startswith("timed-")]
    assert [(t["request_id"], t["outcome"], t["reached_model"]) for t in mine] == [
        ("timed-cancelled", "cancelled", True),
        ("timed-shown", "shown", True),
        ("timed-unopened", "no_document", False),
    ]
    assert mine[1]["new_tokens"] > 0 and mine[0]["new_tokens"] == 0
