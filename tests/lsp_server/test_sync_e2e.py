"""The server syncs its index to the backend when `index.sync` is on (ids and vectors only)."""

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

from backend.local import LocalBackend
from evaluation.lsp_client import plain
from tests.lsp_server.conftest import load_profile
from tests.support.fixtures import tiny_embedder_path


@pytest.fixture
def local_backend() -> Iterator[LocalBackend]:
    backend = LocalBackend().start()
    yield backend
    backend.stop()


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "shapes.py").write_text("def area(w, h):\n    return w * h\n")
    (root / "main.py").write_text("from pkg.shapes import area\n\nprint(area(2, 3))\n")
    return root


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server", "--stdio"])
)
async def client(
    lsp_client: LanguageClient,
    workspace: Path,
    local_backend: LocalBackend,
    tiny_model_path: Path,
    tmp_path: Path,
) -> AsyncIterator[None]:
    embedder = tiny_embedder_path()
    await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=load_profile("neovim-0.12").capabilities,
            root_uri=workspace.as_uri(),
            initialization_options={
                "cacheDir": str(tmp_path / "cache"),
                "completion": {"model": str(tiny_model_path)},
                "index": {"embeddingModel": str(embedder), "sync": True},
                "telemetry": {"backendUrl": local_backend.url, "token": local_backend.token},
            },
        )
    )
    yield
    await lsp_client.shutdown_session()


async def test_index_reaches_the_backend(client: LanguageClient) -> None:
    deadline = time.monotonic() + 300
    sync: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = plain(await client.protocol.send_request_async("tabloop/status", {}))
        sync = status.get("sync") or {}
        # A sync may come before the index holds anything (the empty root, nothing to send):
        # wait for the one that sends the files.
        if (sync.get("totals") or {}).get("files_uploaded", 0) >= 2:
            break
        await asyncio.sleep(0.5)
    else:
        pytest.fail(f"the index never synced: {sync}")
    assert sync["failures"] == 0
    # The backend was empty: the workspace's two files went up, in one sync or over several.
    totals = sync["totals"]
    assert totals["files_uploaded"] == 2 and totals["chunks_placed"] >= 2
    assert sync["last"]["root"] == sync["synced_root"]
