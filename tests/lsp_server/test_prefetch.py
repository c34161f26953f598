"""Prefetch after a shown suggestion, over a real server with a scripted model.

The request that follows an acceptance must be answered from the prefetched cache, not by a model
call; any other edit must cancel the prefetch.
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
from tests.lsp_server.conftest import load_profile
from tests.lsp_server.test_e2e import init_options, inline_params, open_document, wait_until_ready
from tests.support.completion_server import serve_completions
from tests.support.scripted_model import ScriptedModel, code_before_cursor

pytestmark = pytest.mark.asyncio(loop_scope="module")

SOURCE = "def join_words(words, separator):\n    kept = [w for w in words if w]\n    result = \n"
CURSOR = types.Position(line=2, character=13)
FIRST = "separator.join(kept)"
AFTER_ACCEPT = " if kept else None"

SLOW_SOURCE = "def total(values):\n    count = \n"
SLOW_CURSOR = types.Position(line=1, character=12)
SLOW_FIRST = "len(values)"
SLOW_AFTER = " + sum(1 for value in values if value is None and value is not None)"


@pytest.fixture(scope="module")
def scripted_model() -> ScriptedModel:
    return ScriptedModel(
        rules={
            "    result = " + FIRST: AFTER_ACCEPT,
            "    result = ": FIRST,
            "    count = " + SLOW_FIRST: SLOW_AFTER,
            "    count = ": SLOW_FIRST,
        }
    )


@pytest.fixture(scope="module")
def model_url(scripted_model: ScriptedModel) -> Iterator[str]:
    with serve_completions(scripted_model) as (url, _):
        yield url


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server", "--stdio"]),
    scope="module",
)
async def client(
    lsp_client: LanguageClient, model_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[None]:
    workspace = tmp_path_factory.mktemp("prefetch")
    (workspace / "words.py").write_text(SOURCE, encoding="utf-8")
    (workspace / "total.py").write_text(SLOW_SOURCE, encoding="utf-8")
    await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=load_profile("vscode").capabilities,
            root_uri=workspace.as_uri(),
            initialization_options=init_options(model_url, tmp_path_factory.mktemp("cache")),
        )
    )
    lsp_client.workspace_for_tests = workspace  # type: ignore[attr-defined]
    yield
    await lsp_client.shutdown_session()


async def status_of(client: LanguageClient) -> dict[str, Any]:
    return dict(plain(await client.protocol.send_request_async("tabloop/status", {})))


async def wait_for(client: LanguageClient, key: str, value: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while (await status_of(client)).get(key, 0) < value:
        assert time.monotonic() < deadline, f"{key} never reached {value}"
        await asyncio.sleep(0.05)


def insert(client: LanguageClient, uri: str, version: int, at: types.Position, text: str) -> None:
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(start=at, end=at), text=text
                )
            ],
        )
    )


async def test_the_request_after_accepting_is_answered_from_the_prefetch(
    client: LanguageClient, scripted_model: ScriptedModel
) -> None:
    assert (await wait_until_ready(client))["model"]["state"] == "ready"
    workspace: Path = client.workspace_for_tests  # type: ignore[attr-defined]
    uri = open_document(client, workspace / "words.py", SOURCE)
    answer = await client.text_document_inline_completion_async(inline_params(uri, CURSOR))
    assert answer is not None and [i.insert_text for i in answer.items] == [FIRST]
    # The prefetch asks the model at the cursor the acceptance leads to, before anyone asks.
    await wait_for(client, "prefetchStarted", 1)
    deadline = time.monotonic() + 20
    while not any(code_before_cursor(p).endswith(FIRST) for p in scripted_model.prompts):
        assert time.monotonic() < deadline, "the prefetch never reached the model"
        await asyncio.sleep(0.05)
    insert(client, uri, 2, CURSOR, FIRST)  # the editor applies the accepted suggestion
    after = types.Position(line=CURSOR.line, character=CURSOR.character + len(FIRST))
    answer = await client.text_document_inline_completion_async(inline_params(uri, after))
    assert answer is not None and [i.insert_text for i in answer.items] == [AFTER_ACCEPT]
    timings = plain(await client.protocol.send_request_async("tabloop/timings", {}))
    assert timings[-1]["cache_source"] == "prefetch"
    # The model saw the accepted cursor once: the prefetch. (A prefetch for the cursor after this
    # new suggestion may already be running: that is the next one, not this request.)
    here = [p for p in scripted_model.prompts if code_before_cursor(p).endswith(FIRST)]
    assert len(here) == 1, "the request after Tab called the model again"
    status = await status_of(client)
    assert status["prefetchUsed"] == 1


async def test_any_other_edit_cancels_the_prefetch(
    client: LanguageClient, scripted_model: ScriptedModel
) -> None:
    workspace: Path = client.workspace_for_tests  # type: ignore[attr-defined]
    uri = open_document(client, workspace / "total.py", SLOW_SOURCE)
    before = await status_of(client)
    scripted_model.token_delay_s = 0.3  # the prefetch's answer takes seconds: time to move on
    try:
        answer = await client.text_document_inline_completion_async(inline_params(uri, SLOW_CURSOR))
        assert answer is not None and [i.insert_text for i in answer.items] == [SLOW_FIRST]
        await wait_for(client, "prefetchStarted", before["prefetchStarted"] + 1)
        # The user types something else at the top of the file instead of accepting.
        insert(client, uri, 2, types.Position(line=0, character=0), "# ")
        await wait_for(client, "prefetchCancelled", before["prefetchCancelled"] + 1)
    finally:
        scripted_model.token_delay_s = 0.0
    status = await status_of(client)
    assert status["prefetchUsed"] == before["prefetchUsed"]
