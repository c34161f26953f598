"""The next edit after an accepted one, computed ahead, through the real server over stdio.

As in `test_next_edit_e2e`, a loopback OpenAI-compatible server stands in for the model, here
answering by the window the prompt shows: it carries a rename on one use at a time, so each
accepted prediction leads to another. The editor's side is what the clients do on Tab: apply the
edit as one `didChange`, put the cursor after it, run `tabloop.acceptNextEdit`, ask again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from lsp_server.protocol import (
    ACCEPT_NEXT_EDIT_COMMAND,
    DID_SHOW_INLINE_EDIT_NOTIFICATION,
    NEXT_EDIT_REJECTED_NOTIFICATION,
)
from tests.completion.next_edit.test_accepted import BEFORE, RENAMED, STEP1, STEP2
from tests.lsp_server.test_next_edit_e2e import (
    SERVER,
    Document,
    last_timing,
    start_server,
    status_of,
    wait_for_model_call,
)
from tests.support.completion_server import serve_completions
from tests.support.scripted_model import ScriptedModel

pytestmark = pytest.mark.asyncio(loop_scope="module")

SEP = "<|file_sep|>"
# The user renames `width` on line 0 of BEFORE (columns 10-15): RENAMED. Each prediction renames
# one more use: STEP1, then STEP2.


def rule(path: str, window: str) -> str:
    return f"{SEP}current/{path}\n{window}{SEP}updated/{path}\n"


MODEL = ScriptedModel(
    rules={
        key: answer
        for path in (
            *("chain.py", "moved.py", "dismissed.py", "off.py", "read.py", "taken.py", "typed.py"),
        )
        for key, answer in ((rule(path, RENAMED), STEP1 + SEP), (rule(path, STEP1), STEP2 + SEP))
    }
    # After the second step, a rewrite of many tokens: with a slow model, one to stop midway.
    | {
        rule(path, STEP2): STEP2 + "# " + "word " * 40 + "\n" + SEP
        for path in ("dismissed.py", "typed.py")
    }
    # A third step: a comment on the last line.
    | {
        rule(path, STEP2): STEP2.replace("wide + w", "wide + w  # " + "word " * 10) + SEP
        for path in ("taken.py", "off.py")
    }
)


@pytest_lsp.fixture(config=SERVER, scope="module")
async def client(
    lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[None]:
    """The server, on `MODEL` served over loopback HTTP, in the workspace `workspace` names."""
    root, cache = tmp_path_factory.getbasetemp() / "prefetch-ws", tmp_path_factory.mktemp("cache")
    root.mkdir(exist_ok=True)
    next_edit = {"windowTokens": 64, "marginTokens": 512, "screenBelow": 0}
    with serve_completions(MODEL) as (url, _):
        await start_server(lsp_client, root, cache, url, next_edit, {"level": "off"})
        yield
        await lsp_client.shutdown_session()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp() / "prefetch-ws"


@contextmanager
def slow_model(token_delay_s: float) -> Iterator[None]:
    """Each step of the scripted model takes `token_delay_s` inside the block."""
    MODEL.token_delay_s = token_delay_s
    try:
        yield
    finally:
        MODEL.token_delay_s = 0.0


async def prefetch_status(client: LanguageClient) -> dict[str, int]:
    found = (await status_of(client))["nextEdit"]
    return {k: found[k] for k in ("prefetchStarted", "prefetchUsed", "prefetchCancelled")}


async def until(check: Any, what: str) -> None:
    """Until `await check()` is true (seconds at most: not stuck)."""
    deadline = time.monotonic() + 30
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def edited(prompt: str, path: str) -> str:
    """The window a prompt shows as current."""
    start = prompt.index(f"{SEP}current/{path}\n") + len(f"{SEP}current/{path}\n")
    return prompt[start : prompt.index(f"{SEP}updated/{path}\n")]


async def shown_and_ahead(
    client: LanguageClient, workspace: Path, name: str
) -> tuple[Document, dict[str, Any], int]:
    """A document where the user renamed `width`, the edit shown there, and the model calls
    before it, once the model has been asked about the one after it."""
    document = Document(client, workspace, name, BEFORE)
    document.edit(0, 10, 15, "w")
    calls = len(MODEL.prompts)
    (first,) = await document.ask(0, 11)
    await wait_for_model_call(calls + 1, MODEL)
    return document, first, calls


async def accept(client: LanguageClient, document: Document, item: dict[str, Any]) -> None:
    """What the editors do on Tab: the edit applied as one change, then the command."""
    client.protocol.notify(DID_SHOW_INLINE_EDIT_NOTIFICATION, {"item": item})
    start, end = item["range"]["start"], item["range"]["end"]
    assert start["line"] == end["line"]
    document.edit(start["line"], start["character"], end["character"], item["text"])
    await client.workspace_execute_command_async(
        types.ExecuteCommandParams(
            command=ACCEPT_NEXT_EDIT_COMMAND, arguments=item["command"]["arguments"]
        )
    )


async def test_the_edit_after_an_accepted_one_comes_without_a_model_call(
    client: LanguageClient, workspace: Path
) -> None:
    before = await prefetch_status(client)
    document, first, calls = await shown_and_ahead(client, workspace, "chain.py")
    assert (first["range"]["start"], first["text"]) == ({"line": 1, "character": 12}, "")
    # While the user read it, the server asked the model about the window accepting it makes.
    assert edited(MODEL.prompts[calls + 1], "chain.py") == STEP1

    await accept(client, document, first)
    (second,) = await document.ask(1, 12)  # the cursor after the accepted edit
    assert (second["range"]["start"], second["text"]) == ({"line": 2, "character": 19}, "")
    timing = await last_timing(client)
    assert (timing["outcome"], timing["reused"], timing["reached_model"]) == ("shown", True, True)
    # No model call for it; the next one asked about is the window after the second.
    await wait_for_model_call(calls + 2, MODEL)
    assert edited(MODEL.prompts[calls + 2], "chain.py") == STEP2
    after = await prefetch_status(client)
    assert after["prefetchStarted"] - before["prefetchStarted"] == 2
    assert after["prefetchUsed"] - before["prefetchUsed"] == 1


async def test_a_prediction_computed_ahead_answers_only_the_state_it_was_computed_for(
    client: LanguageClient, workspace: Path
) -> None:
    document, first, calls = await shown_and_ahead(client, workspace, "moved.py")
    # The user types on instead of accepting (the clients then send the rejection).
    client.protocol.notify(NEXT_EDIT_REJECTED_NOTIFICATION, {"id": first["id"], "reason": "typed"})
    document.edit(0, 11, 11, "idth2")  # `scale(width2, ...)`
    used = (await prefetch_status(client))["prefetchUsed"]
    await document.ask(0, 16)
    timing = await last_timing(client)
    assert timing["reused"] is False and timing["reached_model"]
    assert len(MODEL.prompts) == calls + 3
    assert (await prefetch_status(client))["prefetchUsed"] == used


async def test_a_dismissal_stops_a_prefetch_in_flight(
    client: LanguageClient, workspace: Path
) -> None:
    document, first, calls = await shown_and_ahead(client, workspace, "dismissed.py")
    with slow_model(0.5):  # from here each rewrite takes seconds
        cancelled = (await prefetch_status(client))["prefetchCancelled"]
        await accept(client, document, first)
        (second,) = await document.ask(1, 12)  # computed ahead: answered at once
        # The model is asked about the window after the second.
        await wait_for_model_call(calls + 2, MODEL)
        client.protocol.notify(
            NEXT_EDIT_REJECTED_NOTIFICATION, {"id": second["id"], "reason": "dismissed"}
        )

        async def stopped() -> bool:
            return (await prefetch_status(client))["prefetchCancelled"] == cancelled + 1

        await until(stopped, "the prefetch stopped")
        # The model thread is free again: a request there is answered (by the model, since
        # the prefetch did not finish).
        document.edit(2, 4, 4, "# ")
        await document.ask(2, 6)
        assert (await last_timing(client))["reused"] is False


async def ask_inline(client: LanguageClient, uri: str, line: int, character: int) -> Any:
    return await client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=line, character=character),
            context=types.InlineCompletionContext(
                trigger_kind=types.InlineCompletionTriggerKind.Automatic
            ),
        )
    )


async def test_an_inline_request_stops_a_prefetch_the_user_has_not_taken(
    client: LanguageClient, workspace: Path
) -> None:
    with slow_model(0.1):  # each rewrite takes seconds
        cancelled = (await prefetch_status(client))["prefetchCancelled"]
        document, first, _ = await shown_and_ahead(client, workspace, "read.py")
        # One answered without the model (a document never opened) leaves the prefetch running.
        unopened = await ask_inline(client, (workspace / "unopened.py").as_uri(), 0, 0)
        assert not unopened.items
        assert (await prefetch_status(client))["prefetchCancelled"] == cancelled
        # While the edit is shown, an inline completion request takes the model thread.
        await ask_inline(client, document.uri, 0, 11)
        assert (await prefetch_status(client))["prefetchCancelled"] == cancelled + 1
        assert "<|fim_prefix|>" in MODEL.prompts[-1]
        await accept(client, document, first)
        (second,) = await document.ask(1, 12)
        assert second["range"]["start"] == {"line": 2, "character": 19}
        assert (await last_timing(client))["reused"] is False


async def test_an_inline_request_waits_for_the_edit_after_tab(
    client: LanguageClient, workspace: Path
) -> None:
    """Neovim asks for an inline completion 200 ms after the cursor moves, so also after Tab
    took a next edit: the edit after it, being computed ahead, is not stopped for it."""
    document, first, calls = await shown_and_ahead(client, workspace, "taken.py")
    await accept(client, document, first)
    with slow_model(0.1):  # the prediction after the second step takes seconds
        (second,) = await document.ask(1, 12)  # computed ahead: answered at once
        await wait_for_model_call(calls + 2, MODEL)
        used = (await prefetch_status(client))["prefetchUsed"]
        await accept(client, document, second)
        inline = asyncio.create_task(ask_inline(client, document.uri, 2, 19))
        (third,) = await document.ask(2, 19)
        timing = await last_timing(client)
        assert (timing["outcome"], timing["reused"]) == ("shown", True)
        assert third["text"].startswith("  # word")
        await inline
        assert any("<|fim_prefix|>" in prompt for prompt in MODEL.prompts[calls + 3 :])
        assert (await prefetch_status(client))["prefetchUsed"] == used + 1


async def test_typing_stops_a_prefetch_the_request_after_tab_waits_for(
    client: LanguageClient, workspace: Path
) -> None:
    document, first, calls = await shown_and_ahead(client, workspace, "typed.py")
    with slow_model(0.5):  # from here each rewrite takes seconds
        await accept(client, document, first)
        (second,) = await document.ask(1, 12)  # computed ahead: answered at once
        await wait_for_model_call(calls + 2, MODEL)  # the one after it is being computed
        cancelled = (await prefetch_status(client))["prefetchCancelled"]
        await accept(client, document, second)
        requests = (await status_of(client))["nextEdit"]["requests"]
        waiting = asyncio.create_task(document.ask(2, 19))  # waits for that prefetch

        async def arrived() -> bool:
            # Its handler runs without a pause up to its wait on the model thread.
            return bool((await status_of(client))["nextEdit"]["requests"] > requests)

        await until(arrived, "the request after Tab reached the server")
        document.edit(0, 0, 0, "# ")  # the user types instead: both stop
        assert await waiting == []
        assert (await last_timing(client))["outcome"] == "cancelled"
        assert (await prefetch_status(client))["prefetchCancelled"] == cancelled + 1
        # The model thread is free again: a request there is answered.
        document.edit(0, 2, 2, "x")
        await document.ask(0, 3)
        assert (await last_timing(client))["outcome"] in ("shown", "no_change")


async def test_with_prefetch_off_nothing_is_computed_ahead(
    client: LanguageClient, workspace: Path
) -> None:
    """Last in the module: the settings pushed here stay."""
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"tabloop": {"nextEdit": {"prefetch": False}}})
    )
    # This client has no `workspace/configuration`, so the pushed settings apply in the
    # handler's first step, before the server reads the next request.
    started = (await prefetch_status(client))["prefetchStarted"]
    document = Document(client, workspace, "off.py", BEFORE)
    document.edit(0, 10, 15, "w")
    calls = len(MODEL.prompts)
    (first,) = await document.ask(0, 11)
    await accept(client, document, first)
    (second,) = await document.ask(1, 12)
    assert second["range"]["start"] == {"line": 2, "character": 19}
    assert len(MODEL.prompts) == calls + 2
    assert (await last_timing(client))["reused"] is False
    assert (await prefetch_status(client))["prefetchStarted"] == started
    # The request after Tab computes its own, and an inline request then waits for it too.
    await accept(client, document, second)
    with slow_model(0.1):  # the rewrite takes seconds
        after_tab = asyncio.create_task(document.ask(2, 19))
        await wait_for_model_call(calls + 2, MODEL)  # the third call: on the model thread
        inline = asyncio.create_task(ask_inline(client, document.uri, 2, 19))
        (third,) = await after_tab
        timing = await last_timing(client)
        assert (timing["outcome"], timing["reused"]) == ("shown", False)
        assert third["text"].startswith("  # word")
        await inline
        assert "<|fim_prefix|>" in MODEL.prompts[-1]  # the inline request ran after it
