"""Over stdio, the completion prompt carries context from the workspace index once it exists."""

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
from tests.lsp_server.conftest import load_profile
from tests.support.fixtures import tiny_embedder_path

GEOMETRY = '''\
"""Shapes."""


def rectangle_area(width, height):
    """Area of a width x height rectangle."""
    return width * height
'''
MAIN = "from geometry import rectangle_area\n\nroom = rectangle_area(\n"
CURSOR = types.Position(line=2, character=len("room = rectangle_area("))


async def status(client: LanguageClient) -> dict[str, Any]:
    result: dict[str, Any] = plain(await client.protocol.send_request_async("tabloop/status", {}))
    return result


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    root.mkdir()
    (root / "geometry.py").write_text(GEOMETRY, encoding="utf-8")
    (root / "main.py").write_text(MAIN, encoding="utf-8")
    return root


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server", "--stdio"])
)
async def client(
    lsp_client: LanguageClient, tiny_model_path: Path, workspace: Path, tmp_path: Path
) -> AsyncIterator[None]:
    embedder = tiny_embedder_path()
    await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=load_profile("vscode").capabilities,
            root_uri=workspace.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=workspace.as_uri(), name="ws")],
            initialization_options={
                "cacheDir": str(tmp_path / "cache"),
                "completion": {"model": str(tiny_model_path), "maxNewTokens": 8},
                "policy": {"showFloor": 1.0},
                "index": {"embeddingModel": str(embedder)},
                "telemetry": {"level": "off"},
            },
        )
    )
    yield
    await lsp_client.shutdown_session()


async def test_completion_uses_the_index(client: LanguageClient, workspace: Path) -> None:
    lsp_client = client
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        current = await status(lsp_client)
        if current["model"]["state"] == "ready" and current.get("index", {}).get("chunks", 0) > 0:
            break
        await asyncio.sleep(0.2)
    else:
        pytest.fail(f"model and index never both ready: {current}")
    # The index embeds in ONNX Runtime: the server never imports torch for it.
    assert current["index"]["embeddingEngine"] == "onnxruntime"
    uri = (workspace / "main.py").as_uri()
    lsp_client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(
                uri=uri, language_id="python", version=1, text=MAIN
            )
        )
    )
    await lsp_client.text_document_inline_completion_async(
        types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=CURSOR,
            context=types.InlineCompletionContext(
                trigger_kind=types.InlineCompletionTriggerKind.Invoked
            ),
        )
    )
    timings = plain(await lsp_client.protocol.send_request_async("tabloop/timings", {}))
    assert timings, "the request was not answered by the engine"
    # The definition of `rectangle_area` from geometry.py was put into the prompt.
    assert timings[-1]["retrieval_found"] == 1.0
