"""The index feature in the real server over stdio: progress, search, symbols, edits."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from evaluation.lsp_client import plain
from tests.indexer.conftest import PLUMBING_MODULES, copy_stdlib
from tests.lsp_server.conftest import load_profile

pytestmark = pytest.mark.asyncio(loop_scope="module")

SERVER = ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server", "--stdio"])
ADDED = '''

def frobnicate_widgets(widgets, factor):
    """Scale every widget's frobnication level by a factor."""
    return [widget.frobnicate(factor) for widget in widgets]
'''


@pytest.fixture(scope="module")
def index_workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_stdlib(tmp_path_factory.mktemp("lsp-index-ws"), PLUMBING_MODULES)


@pytest_lsp.fixture(config=SERVER, scope="module")
async def client(
    lsp_client: LanguageClient,
    index_workspace: Path,
    tiny_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[None]:
    profile = load_profile("vscode")
    options = {
        "cacheDir": str(tmp_path_factory.mktemp("lsp-index-cache")),
        "completion": {"enabled": False},
        "index": {"embeddingModel": str(tiny_model_dir), "debounceMs": 50, "watch": False},
        "telemetry": {"level": "off"},
    }
    params = types.InitializeParams(
        capabilities=profile.capabilities,
        client_info=profile.client_info,
        root_uri=index_workspace.as_uri(),
        workspace_folders=[types.WorkspaceFolder(uri=index_workspace.as_uri(), name="ws")],
        initialization_options=options,
    )
    await lsp_client.initialize_session(params)
    yield
    await lsp_client.shutdown_session()


async def index_status(client: LanguageClient) -> dict[str, Any]:
    status: dict[str, Any] = plain(await client.protocol.send_request_async("tabloop/status", {}))
    return status.get("index", {})


async def wait_for(client: LanguageClient, predicate: Any, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, await index_status(client)
        await asyncio.sleep(0.1)


async def test_indexes_with_progress_then_searches(
    client: LanguageClient, index_workspace: Path
) -> None:
    async def ready() -> bool:
        return (await index_status(client)).get("state") == "ready"

    await wait_for(client, ready)
    status = await index_status(client)
    assert status["files"] == 8 and status["chunks"] > 30
    await wait_for(client, lambda: _ended(client))
    kinds = [type(r).__name__ for reports in client.progress_reports.values() for r in reports]
    assert kinds[0] == "WorkDoneProgressBegin" and kinds[-1] == "WorkDoneProgressEnd"
    hits = plain(
        await client.protocol.send_request_async("tabloop/search", {"query": "bisect", "k": 3})
    )
    assert len(hits) == 3
    for hit in hits:
        assert set(hit) >= {"uri", "range", "score", "preview"}
        assert hit["uri"].startswith(index_workspace.as_uri())
        assert hit["range"]["start"]["line"] < hit["range"]["end"]["line"]
    empty = await client.protocol.send_request_async("tabloop/search", {"query": " ", "k": 3})
    assert plain(empty) == []


async def _ended(client: LanguageClient) -> bool:
    return any(
        isinstance(r, types.WorkDoneProgressEnd)
        for reports in client.progress_reports.values()
        for r in reports
    )


async def test_workspace_symbols(client: LanguageClient, index_workspace: Path) -> None:
    symbols = await client.workspace_symbol_async(types.WorkspaceSymbolParams(query="insort"))
    assert symbols
    names = {s.name for s in symbols}
    assert {"insort_left", "insort_right"} <= names
    first = next(s for s in symbols if s.name == "insort_right")
    assert first.kind == types.SymbolKind.Function
    assert isinstance(first.location, types.Location)
    assert first.location.uri == (index_workspace / "bisect.py").as_uri()
    method = await client.workspace_symbol_async(types.WorkspaceSymbolParams(query="raw_decode"))
    assert method and method[0].kind == types.SymbolKind.Method
    assert method[0].container_name == "JSONDecoder"


async def test_unsaved_edits_are_indexed(client: LanguageClient, index_workspace: Path) -> None:
    path = index_workspace / "colorsys.py"
    uri = path.as_uri()
    text = path.read_text()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(
                uri=uri, language_id="python", version=1, text=text
            )
        )
    )
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text + ADDED)],
        )
    )

    async def names() -> set[str]:
        query = types.WorkspaceSymbolParams(query="frobnicate_widgets")
        return {s.name for s in await client.workspace_symbol_async(query) or []}

    async def found() -> bool:
        return "frobnicate_widgets" in await names()

    await wait_for(client, found, 30)
    client.text_document_did_close(
        types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )

    async def gone() -> bool:
        return "frobnicate_widgets" not in await names()

    await wait_for(client, gone, 30)
