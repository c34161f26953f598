"""The start of the next prediction's prompt, read between edits (`nextEdit.preread`), through the
real server over stdio on the committed tiny model (torch, float32; next edits on the same
runner): the prediction asked in a new edit reads only what follows the blocks read ahead."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from pytest_lsp import ClientServerConfig, LanguageClient

from evaluation.lsp_client import plain
from tests.lsp_server.test_e2e import wait_until_ready
from tests.lsp_server.test_next_edit_e2e import Document, last_timing
from tests.lsp_server.test_tiny_model_e2e import start_session

TEXT = "".join(f"value_{n} = {n}\n" for n in range(60))


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server", "--stdio"])
)
async def client(
    lsp_client: LanguageClient,
    tiny_model_path: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> AsyncIterator[None]:
    """The server; `nextEdit.preread` as the test's indirect parameter says (on without one)."""
    completion = {"model": str(tiny_model_path), "engine": "torch"}
    preread = getattr(request, "param", True)
    next_edit = {"engine": "completion", "screenBelow": 0, "preread": preread}
    await start_session(lsp_client, tmp_path, completion, nextEdit=next_edit)
    yield
    await lsp_client.shutdown_session()


async def status(client: LanguageClient) -> dict[str, Any]:
    found: dict[str, Any] = plain(await client.protocol.send_request_async("tabloop/status", {}))
    return found


async def idle_preread(client: LanguageClient, started: int) -> dict[str, int]:
    """The pre-read counters once `started` reads have begun and the model thread is idle (not
    stuck: seconds at most)."""
    deadline = time.monotonic() + 60
    while True:
        found = await status(client)
        preread: dict[str, int] = found["nextEdit"]["preread"]
        if preread["started"] >= started and found["model"]["jobs"] == 0:
            return preread
        assert time.monotonic() < deadline, found
        await asyncio.sleep(0.05)


async def two_edits_and_a_prediction(
    client: LanguageClient, name: str, reads: int
) -> dict[str, Any]:
    """An edit on line 0, a pause past the history's (and the `reads` begun in it), an edit on
    line 40 (an event of its own), and the prediction there: its timing."""
    workspace: Path = client.workspace_for_tests  # type: ignore[attr-defined]
    document = Document(client, workspace, name, TEXT)
    document.edit(0, 0, 0, "x_")
    await asyncio.sleep(1.2)  # the history's pause (1 s): the event is over
    await idle_preread(client, reads)
    document.edit(40, 0, 0, "y_")
    await document.ask(40, 2)
    return await last_timing(client)


async def test_the_prediction_in_a_new_edit_reads_only_what_follows_the_blocks_read_ahead(
    client: LanguageClient,
) -> None:
    ready = await wait_until_ready(client)
    assert ready["model"]["state"] == "ready", ready
    timing = await two_edits_and_a_prediction(client, "ahead.py", 1)
    assert timing["reached_model"] and timing["outcome"] != "error", timing
    preread = await idle_preread(client, 2)
    # The pause read the first edit's block. The second edit's first change asked for it again
    # (found kept, or stopped by the prediction asked right after it).
    assert preread["started"] == 2 and preread["held"] + preread["stopped"] == 1, preread
    assert preread["tokens"] > 0
    # The prediction's prompt starts with that block, and computed only the rest.
    assert timing["cached_tokens"] == preread["tokens"], (timing, preread)
    assert timing["prompt_tokens"] > preread["tokens"]


@pytest.mark.parametrize("client", [False], indirect=True)
async def test_without_preread_the_prediction_reads_its_whole_prompt(
    client: LanguageClient,
) -> None:
    ready = await wait_until_ready(client)
    assert ready["model"]["state"] == "ready", ready
    timing = await two_edits_and_a_prediction(client, "cold.py", 0)
    assert timing["reached_model"] and timing["cached_tokens"] == 0, timing
    preread = (await status(client))["nextEdit"]["preread"]
    assert not any(preread.values()), preread
