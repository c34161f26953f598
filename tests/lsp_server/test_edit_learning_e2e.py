"""The server learns next edits from the user's editing: live examples over stdio.

A real server with a scripted model on loopback (its tokenizer estimate sizes the windows). The
test edits a document as an editor would, waits until the server has noted the pause (its status
says a pause is settling), makes the next edit, and reads the example the server kept in the
workspace's store: the prompt the predictor writes at the pause, the window as it was, and the
window the user settled on.
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
from tests.lsp_server.test_e2e import wait_until_ready
from tests.support.completion_server import serve_completions
from tests.support.scripted_model import ScriptedModel
from training.edit_store import EditExampleStore
from training.feedback import FEEDBACK_FILE

pytestmark = pytest.mark.asyncio(loop_scope="module")

SOURCE = """\
def area(width, height):
    return width * height


def show(width, height):
    print(area(width, height))
"""
SETTLE_S = 5.0  # long enough for the test's next edit to land inside it on a loaded machine


@pytest.fixture(scope="module")
def model_url() -> Iterator[str]:
    with serve_completions(ScriptedModel(rules={})) as (url, _):
        yield url


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ws")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server", "--stdio"]),
    scope="module",
)
async def client(
    lsp_client: LanguageClient, model_url: str, workspace: Path, cache: Path
) -> AsyncIterator[None]:
    options = {
        "cacheDir": str(cache),
        "completion": {"runner": "http", "httpUrl": model_url, "fimTemplate": "qwen"},
        "nextEdit": {"windowTokens": 64, "learnSettleS": SETTLE_S},
        "index": {"enabled": False},
        "telemetry": {"level": "off"},
        "training": {"auto": False},
    }
    await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=types.ClientCapabilities(),
            root_uri=workspace.as_uri(),
            initialization_options=options,
        )
    )
    status = await wait_until_ready(lsp_client)
    assert status["model"]["state"] == "ready", status
    yield
    await lsp_client.shutdown_session()


async def learning(client: LanguageClient) -> dict[str, Any]:
    status = plain(await client.protocol.send_request_async("tabloop/status", {}))
    found: dict[str, Any] = status["nextEditLearning"]
    return found


async def until(client: LanguageClient, key: str, value: int, timeout_s: float = 60) -> None:
    """Wait until the learning status's `key` is `value` (not stuck: a minute)."""
    deadline = time.monotonic() + timeout_s
    while (await learning(client)).get(key, 0) != value:
        assert time.monotonic() < deadline, await learning(client)
        await asyncio.sleep(0.05)


class Editor:
    """One open document, edited over `didChange`."""

    def __init__(self, client: LanguageClient, path: Path) -> None:
        path.write_text(SOURCE, encoding="utf-8")
        self.client, self.uri, self.version = client, path.as_uri(), 1
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                types.TextDocumentItem(self.uri, "python", self.version, SOURCE)
            )
        )

    def edit(self, line: int, start: int, end: int, text: str) -> None:
        self.version += 1
        change = types.TextDocumentContentChangePartial(
            range=types.Range(types.Position(line, start), types.Position(line, end)), text=text
        )
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                types.VersionedTextDocumentIdentifier(self.version, self.uri), [change]
            )
        )


def _stored(cache: Path, workspace: Path) -> list[Any]:
    store = EditExampleStore(cache / FEEDBACK_FILE, workspace=workspace)
    try:
        return store.examples(store.last_id())
    finally:
        store.close()


async def test_the_edit_after_a_pause_is_kept_as_an_example(
    client: LanguageClient, workspace: Path, cache: Path
) -> None:
    assert (await learning(client))["keeping"] is True
    editor = Editor(client, workspace / "learn.py")
    editor.edit(0, 9, 14, "w")  # area(width, ...) -> area(w, ...)
    await until(client, "settling", 1)  # the pause is noted
    editor.edit(1, 11, 16, "w")  # the next edit: its use too
    await until(client, "kept_edit", 1)
    (example,) = _stored(cache, workspace)
    assert example.path == "learn.py" and example.source == "live"
    assert "    return width * height\n" in example.current
    assert "    return w * height\n" in example.target
    assert example.target == example.current.replace("return width", "return w")
    # The prompt is the predictor's at the pause: the first edit in the history, then the window.
    assert "def area(width, height):" in example.prompt  # the edit's original text
    assert example.prompt.endswith("<|file_sep|>updated/learn.py\n")
    assert "def area(w, height):\n    return width * height\n" in example.prompt


async def test_undoing_the_previous_edit_is_not_an_example(
    client: LanguageClient, workspace: Path, cache: Path
) -> None:
    editor = Editor(client, workspace / "undo.py")
    editor.edit(0, 9, 14, "w")
    await until(client, "settling", 1)
    editor.edit(0, 9, 10, "width")  # put back
    await until(client, "undoes_previous_edit", 1)
    assert all(example.path != "undo.py" for example in _stored(cache, workspace))


async def test_a_closed_document_loses_its_pause(
    client: LanguageClient, workspace: Path, cache: Path
) -> None:
    editor = Editor(client, workspace / "closed.py")
    editor.edit(0, 9, 14, "w")
    await until(client, "settling", 1)
    client.text_document_did_close(
        types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(editor.uri))
    )
    await until(client, "closed", 1)
    assert (await learning(client))["settling"] == 0
