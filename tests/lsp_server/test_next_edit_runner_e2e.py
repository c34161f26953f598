"""Next edits on a runner of their own (`nextEdit.engine = "torch-bfloat16"`), over stdio.

The server loads the committed tiny model for completions (torch, float32) and, once it is
ready, a second runner of the same model in bfloat16 for next edits. What the tiny model writes
differs between CPUs, so the test asserts where the rewrite ran, not what it says.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_lsp
from pytest_lsp import ClientServerConfig, LanguageClient

from evaluation.lsp_client import plain
from tests.lsp_server.test_e2e import wait_until_ready
from tests.lsp_server.test_next_edit_e2e import SOURCE, Document, last_timing
from tests.lsp_server.test_tiny_model_e2e import start_session
from tests.support import adapters as damage
from tests.support.adapters import strong_adapter
from training.edit_track import edit_registry


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server", "--stdio"])
)
async def client(
    lsp_client: LanguageClient, tiny_model_path: Path, tmp_path: Path
) -> AsyncIterator[None]:
    completion = {"model": str(tiny_model_path), "engine": "torch"}
    next_edit = {"engine": "torch-bfloat16", "screenBelow": 0}
    await start_session(lsp_client, tmp_path, completion, nextEdit=next_edit)
    yield
    await lsp_client.shutdown_session()


async def next_edit_status(client: LanguageClient) -> dict[str, Any]:
    status: dict[str, Any] = plain(await client.protocol.send_request_async("tabloop/status", {}))
    found: dict[str, Any] = status["nextEdit"]
    return found


async def test_next_edits_run_on_their_own_bfloat16_runner(client: LanguageClient) -> None:
    status = await wait_until_ready(client)
    assert status["model"]["state"] == "ready", status
    deadline = time.monotonic() + 120  # not stuck: it loads once the engine is ready
    while not (found := await next_edit_status(client))["runnerModelId"]:
        assert not found["runnerError"], found
        assert time.monotonic() < deadline, found
        await asyncio.sleep(0.1)
    assert found["engine"] == "torch-bfloat16"
    assert found["runnerModelId"].startswith("tiny-model")

    workspace: Path = client.workspace_for_tests  # type: ignore[attr-defined]
    document = Document(client, workspace, "rename.py", SOURCE)
    document.rename_width()
    await document.ask()
    timing = await last_timing(client)
    assert timing["reached_model"], timing
    assert timing["prompt_tokens"] > 0 and timing["outcome"] != "not_ready", timing
    assert (await next_edit_status(client))["modelCalls"] == 1


async def test_next_edits_serve_the_next_edit_tracks_adapter_as_it_changes(
    client: LanguageClient, tiny_model_path: Path, tmp_path: Path
) -> None:
    from completion.runners.torch_runner import TorchRunner

    status = await wait_until_ready(client)
    assert status["model"]["state"] == "ready", status
    workspace: Path = client.workspace_for_tests  # type: ignore[attr-defined]
    deadline = time.monotonic() + 120  # not stuck: next edits' runner loads after the engine
    while not (await next_edit_status(client))["runnerModelId"]:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    document = Document(client, workspace, "rename.py", SOURCE)

    async def served_after_an_edit(line: int, start: int, end: int, text: str) -> dict[str, Any]:
        document.edit(line, start, end, text)
        await document.ask(line, start + len(text))
        assert (await last_timing(client))["reached_model"]
        return await next_edit_status(client)

    # The workspace's next-edit track, where `tabloop train model --task next-edit` keeps its
    # versions. Its first version is damaged after it was promoted: refused, the base serves.
    reference = TorchRunner(str(tiny_model_path), tmp_path / "ref", threads=1)
    made = strong_adapter(
        reference.source,
        reference.base_model_id,
        Path(reference.source.location),
        tmp_path / "made",
    )
    registry = edit_registry(workspace.parent / "cache", workspace)
    for _ in (1, 2):
        registry.add(made, reference.base_model_id, {})
    registry.promote(1, force=True)
    damage.flip_byte(registry.path(1))
    found = await served_after_an_edit(0, 9, 14, "w")
    assert found["adapter"] == "" and "v0001" not in found["runnerModelId"], found
    assert found["trackError"], found

    # A good version promoted: served from the next prediction on.
    registry.promote(2, force=True)
    found = await served_after_an_edit(0, 9, 10, "x")
    assert found["adapter"] == str(registry.path(2)), found
    # Named as the track's version, not the completion adapters' v0002.
    assert found["runnerModelId"].endswith("+next-edit-v0002"), found
    assert not found["trackError"], found

    # Rolled back to the damaged one: refused, and the good one keeps serving.
    assert registry.rollback() == 1
    found = await served_after_an_edit(0, 9, 10, "y")
    assert found["adapter"] == str(registry.path(2)) and found["trackError"], found

    # Rolled back to no version: next edits follow the engine, which serves no adapter.
    assert registry.rollback() is None
    found = await served_after_an_edit(0, 9, 10, "z")
    assert found["adapter"] == "" and "v0002" not in found["runnerModelId"], found
