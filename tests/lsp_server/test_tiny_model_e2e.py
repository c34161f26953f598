"""The real tiny model end to end: the server loads it, runs it and answers.

The protocol tests (`test_e2e.py`) script the model's answers. These run the committed tiny
model instead, so they assert only what any output of a sane model satisfies: the request is
answered; a suggestion is clean text at the cursor; an empty answer records why it is empty.
What the model writes differs between CPUs (floating-point kernels), so no test here looks at it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

from completion import postprocess
from evaluation.lsp_client import plain
from tests.lsp_server.conftest import load_profile
from tests.lsp_server.test_e2e import CURSOR, SOURCE, inline_params, open_document, wait_until_ready

EMPTY_REASONS = {
    postprocess.EMPTY_FROM_MODEL,
    postprocess.REPEATS_SUFFIX,
    postprocess.TOO_SHORT,
    postprocess.SYNTAX_DROPPED,
}
SPECIAL_TOKEN = "<|"


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server", "--stdio"])
)
async def client(
    lsp_client: LanguageClient, tiny_model_path: Path, tmp_path: Path
) -> AsyncIterator[None]:
    completion = {"model": str(tiny_model_path), "maxNewTokens": 24}
    workspace = await start_session(lsp_client, tmp_path, completion, policy={"showFloor": 1.0})
    (workspace / "words.py").write_text(SOURCE, encoding="utf-8")
    yield
    await lsp_client.shutdown_session()


async def start_session(
    lsp_client: LanguageClient, tmp_path: Path, completion: dict[str, Any], **options: Any
) -> Path:
    """Initialize a session on the tiny model (index and telemetry off) in a fresh workspace,
    kept as `lsp_client.workspace_for_tests`; `options` are more initialization options."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=load_profile("vscode").capabilities,
            root_uri=workspace.as_uri(),
            initialization_options={
                "cacheDir": str(tmp_path / "cache"),
                "completion": completion,
                "index": {"enabled": False},
                "telemetry": {"level": "off"},
                **options,
            },
        )
    )
    lsp_client.workspace_for_tests = workspace  # type: ignore[attr-defined]
    return workspace


async def test_the_tiny_model_answers_over_stdio(client: LanguageClient) -> None:
    status = await wait_until_ready(client)
    assert status["model"]["state"] == "ready", status
    assert status["model"]["modelId"].startswith("tiny-model")
    assert status["model"]["modelId"].endswith("+ort2-int8")  # the default engine
    # A first use converts the model for the fast engine, and says so while it does.
    messages = [
        getattr(report, "message", None) or ""
        for reports in client.progress_reports.values()
        for report in reports
    ]
    assert any("converting" in message for message in messages), messages
    uri = open_document(client, client.workspace_for_tests / "words.py")  # type: ignore[attr-defined]
    answer = await client.text_document_inline_completion_async(inline_params(uri))
    assert isinstance(answer, types.InlineCompletionList)
    timings: list[dict[str, Any]] = plain(
        await client.protocol.send_request_async("tabloop/timings", {})
    )
    assert len(timings) == 1, "the model was not run for the request"
    record = timings[0]
    assert record["prompt_tokens"] > 0 and record["cache_hit"] == 0.0
    if answer.items:
        (item,) = answer.items
        assert isinstance(item.insert_text, str) and item.insert_text.strip()
        assert SPECIAL_TOKEN not in item.insert_text
        assert item.range == types.Range(start=CURSOR, end=CURSOR)
        assert item.command is not None and item.command.command == "tabloop.accept"
        assert record["action"] == "show"
    else:
        assert record["reason"] in EMPTY_REASONS, record


def test_complete_cli_runs_the_tiny_model(tmp_path: Path, tiny_model_path: Path) -> None:
    source = tmp_path / "words.py"
    source.write_text(SOURCE, encoding="utf-8")
    env = {
        **os.environ,
        "TABLOOP_CACHE_DIR": str(tmp_path / "cache"),
        "TABLOOP_COMPLETION__MODEL": str(tiny_model_path),
        "TABLOOP_COMPLETION__MAX_NEW_TOKENS": "24",
        "TABLOOP_TELEMETRY": "off",
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    location = f"{source}:{CURSOR.line + 1}:{CURSOR.character + 1}"
    result = subprocess.run(
        [sys.executable, "-m", "tabloop", "complete", location, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    decision = json.loads(result.stdout)
    assert decision["model_id"].startswith("tiny-model")
    assert decision["prompt_tokens"] > 0 and decision["new_tokens"] <= 24
    assert SPECIAL_TOKEN not in decision["suggestion"]
    if decision["suggestion"]:
        assert decision["action"] in ("show", "silence")
        assert decision["reason"] == decision["action"]
    else:
        assert decision["action"] == "silence"
        assert decision["reason"] in EMPTY_REASONS, decision


async def test_an_explicit_request_offers_distinct_ranked_candidates(
    client: LanguageClient,
) -> None:
    status = await wait_until_ready(client)
    assert status["model"]["state"] == "ready", status
    uri = open_document(client, client.workspace_for_tests / "words.py")  # type: ignore[attr-defined]
    params = inline_params(uri)
    params.context.trigger_kind = types.InlineCompletionTriggerKind.Invoked
    answer = await client.text_document_inline_completion_async(params)
    assert isinstance(answer, types.InlineCompletionList)
    timings: list[dict[str, Any]] = plain(
        await client.protocol.send_request_async("tabloop/timings", {})
    )
    record = timings[-1]
    if not answer.items:
        assert record["reason"] in EMPTY_REASONS, record
        return
    assert 1 <= len(answer.items) <= 3  # completion.candidates defaults to 3
    assert record["candidates"] == len(answer.items)
    texts = [item.insert_text for item in answer.items]
    assert len(set(texts)) == len(texts), texts
    ids = [
        item.command.arguments[0]
        for item in answer.items
        if item.command and item.command.arguments
    ]
    assert len(set(ids)) == len(answer.items)
    for text in texts:
        assert isinstance(text, str) and text.strip() and SPECIAL_TOKEN not in text
