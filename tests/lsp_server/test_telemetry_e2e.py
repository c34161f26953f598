"""Outcome inference and privacy through the real server over stdio, reporting to a real backend.

The server's model is scripted (served over a loopback OpenAI-compatible server), so every
suggestion is known beforehand; the server always shows it (`showFloor` 1.0) and sends to a
backend on loopback. Each case drives an editor's edits over LSP and then reads what
the backend stored. The workspace is full of canary strings (in identifiers, text and paths);
at the default `metrics` level none of them may appear in any request body.
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

from completion.runners.http import MODEL_VERSION_HEADER
from evaluation.lsp_client import plain
from tests.support.backend_server import BackendServer
from tests.support.completion_server import ServerState, serve_completions
from tests.support.scripted_model import ScriptedModel

pytestmark = pytest.mark.asyncio(loop_scope="module")

CANARY_IDENT = "zqxCanaryIdent7731"
CANARY_TEXT = "zqx-canary-text-5521"
CANARY_DIR = "zqxcanarydir4410"
CANARY_FILE = "zqx_canary_module"
SOURCE = f'''import os


def {CANARY_IDENT}(words, separator=" "):
    """{CANARY_TEXT}: join words with a separator."""
    kept = [word for word in words if word]
    result = <CURSOR>
    return result
'''.replace("<CURSOR>", "")
CURSOR = types.Position(line=6, character=13)
# What the scripted model says after "    result = ": the canaries "separator" and "kept" again.
SUGGESTION = "separator.join(kept)"
ACCEPTED_WORD = SUGGESTION[:2]  # what an accept-word takes of it
IGNORE_AFTER_S = 2.0
RETENTION_SCALE = 20.0  # the 30 s checkpoint comes after 1.5 s
SERVED_VERSION = "v0003"  # the adapter version the completion server says answered
EDITOR_NAME, EDITOR_VERSION = "zqx-editor", "9.8.7"  # clientInfo, carried by every decision


@pytest.fixture(scope="module")
def telemetry_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendServer]:
    db = tmp_path_factory.mktemp("backend") / "backend.sqlite3"
    with BackendServer(f"sqlite:///{db}") as backend:
        yield backend


@pytest.fixture(scope="module")
def model_server() -> Iterator[tuple[str, ServerState]]:
    """A loopback completion server whose model answers `SUGGESTION` at `CURSOR`."""
    model = ScriptedModel(
        rules={
            "    result = " + ACCEPTED_WORD: SUGGESTION[len(ACCEPTED_WORD) :],
            "    result = ": SUGGESTION,
        }
    )
    with serve_completions(model) as running:
        # As the backend does: it names the tenant's adapter version that wrote each answer.
        running[1].headers[MODEL_VERSION_HEADER] = SERVED_VERSION
        yield running


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ws") / CANARY_DIR
    root.mkdir()
    return root


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=[sys.executable, "-m", "lsp_server", "--stdio"]),
    scope="module",
)
async def client(
    lsp_client: LanguageClient,
    model_server: tuple[str, ServerState],
    workspace: Path,
    telemetry_backend: BackendServer,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[None]:
    options = {
        "cacheDir": str(tmp_path_factory.mktemp("cache")),
        "completion": {
            "runner": "http",
            "httpUrl": model_server[0],
            "httpModel": "scripted",
            "fimTemplate": "qwen",
            "maxNewTokens": 16,
        },
        "policy": {"showFloor": 1.0},
        "index": {"enabled": False},
        "telemetry": {
            "level": "metrics",
            "backendUrl": telemetry_backend.url,
            "token": telemetry_backend.token,
            "flushIntervalS": 0.1,
            "ignoreAfterS": IGNORE_AFTER_S,
            "retentionTimeScale": RETENTION_SCALE,
        },
    }
    await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=types.ClientCapabilities(),
            client_info=types.ClientInfo(name=EDITOR_NAME, version=EDITOR_VERSION),
            root_uri=workspace.as_uri(),
            initialization_options=options,
        )
    )
    deadline = time.monotonic() + 120
    while True:
        status = plain(await lsp_client.protocol.send_request_async("tabloop/status", {}))
        if status["model"]["state"] != "loading" or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert status["model"]["state"] == "ready", status
    yield
    await lsp_client.shutdown_session()


class Document:
    """One open document and the edits the test makes to it."""

    def __init__(self, client: LanguageClient, workspace: Path, name: str) -> None:
        self.client = client
        path = workspace / f"{CANARY_FILE}_{name}.py"
        path.write_text(SOURCE, encoding="utf-8")
        self.uri = path.as_uri()
        self.version = 1
        client.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(
                    uri=self.uri, language_id="python", version=1, text=SOURCE
                )
            )
        )

    async def suggest(self, position: types.Position = CURSOR) -> tuple[str, str]:
        """(decision id, suggestion text) of an inline completion at `position`."""
        answer = await self.client.text_document_inline_completion_async(
            types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri=self.uri),
                position=position,
                context=types.InlineCompletionContext(
                    trigger_kind=types.InlineCompletionTriggerKind.Automatic
                ),
            )
        )
        assert isinstance(answer, types.InlineCompletionList) and answer.items
        item = answer.items[0]
        assert item.command is not None and item.command.arguments
        assert isinstance(item.insert_text, str)
        return str(item.command.arguments[0]), item.insert_text

    def edit(self, start: types.Position, end: types.Position, text: str) -> None:
        self.version += 1
        self.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(
                    uri=self.uri, version=self.version
                ),
                content_changes=[
                    types.TextDocumentContentChangePartial(
                        range=types.Range(start=start, end=end), text=text
                    )
                ],
            )
        )

    def insert(self, at: types.Position, text: str) -> types.Position:
        """Insert `text` at `at`; returns the position after it."""
        self.edit(at, at, text)
        return after(at, text)


def after(position: types.Position, text: str) -> types.Position:
    lines = text.split("\n")
    if len(lines) == 1:
        return types.Position(line=position.line, character=position.character + len(text))
    return types.Position(line=position.line + len(lines) - 1, character=len(lines[-1]))


async def stored(
    backend: BackendServer, kind: str, decision_id: str, count: int = 1, timeout: float = 60
) -> list[dict[str, Any]]:
    """The events of `kind` for `decision_id`, once `count` of them have arrived."""
    deadline = time.monotonic() + timeout
    while True:
        found = [
            body
            for _, body in backend.storage.events(backend.tenant_id, type=kind, limit=100_000)
            if body["decision_id"] == decision_id
        ]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.1)


async def accept(client: LanguageClient, decision_id: str) -> None:
    await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="tabloop.accept", arguments=[decision_id])
    )


async def test_full_accept_and_retention_after_later_edits(
    client: LanguageClient, workspace: Path, telemetry_backend: BackendServer
) -> None:
    doc = Document(client, workspace, "accept")
    decision_id, text = await doc.suggest()
    assert text == SUGGESTION
    doc.insert(CURSOR, text)  # the editor applies the item, then runs its command
    await accept(client, decision_id)
    doc.insert(types.Position(line=0, character=0), "import sys\n")  # above: shifts the range
    shifted = types.Position(line=CURSOR.line + 1, character=CURSOR.character)
    doc.edit(shifted, after(shifted, text[:1]), "")  # deletes one accepted character

    (outcome,) = await stored(telemetry_backend, "outcome", decision_id)
    assert (outcome["kind"], outcome["accepted_chars"]) == ("accepted", len(SUGGESTION))
    (decision,) = await stored(telemetry_backend, "decision", decision_id)
    assert decision["action"] == "show" and decision["suggestion_chars"] == len(SUGGESTION)
    assert (decision["client_name"], decision["client_version"]) == (EDITOR_NAME, EDITOR_VERSION)
    (retention,) = await stored(telemetry_backend, "retention", decision_id)
    assert retention["after_s"] == 30
    assert retention["accepted_chars"] == len(SUGGESTION)
    assert retention["retained_chars"] == len(SUGGESTION) - 1


async def test_partial_accept_then_a_new_request(
    client: LanguageClient, workspace: Path, telemetry_backend: BackendServer
) -> None:
    doc = Document(client, workspace, "partial")
    decision_id, text = await doc.suggest()
    assert text == SUGGESTION
    end = doc.insert(CURSOR, ACCEPTED_WORD)  # accept-word: two characters at once
    _, rest = await doc.suggest(end)
    assert rest == SUGGESTION[len(ACCEPTED_WORD) :]
    (outcome,) = await stored(telemetry_backend, "outcome", decision_id)
    assert (outcome["kind"], outcome["accepted_chars"]) == ("partial", len(ACCEPTED_WORD))


async def test_divergent_typing_is_ignored(
    client: LanguageClient, workspace: Path, telemetry_backend: BackendServer
) -> None:
    doc = Document(client, workspace, "diverge")
    decision_id, text = await doc.suggest()
    assert text == SUGGESTION
    doc.insert(CURSOR, "@")  # not how the suggestion starts
    (outcome,) = await stored(telemetry_backend, "outcome", decision_id)
    assert (outcome["kind"], outcome["reason"]) == ("ignored", "diverged")


async def test_no_reaction_times_out_as_ignored(
    client: LanguageClient, workspace: Path, telemetry_backend: BackendServer
) -> None:
    doc = Document(client, workspace, "timeout")
    decision_id, _ = await doc.suggest()
    (outcome,) = await stored(telemetry_backend, "outcome", decision_id)
    assert (outcome["kind"], outcome["reason"]) == ("ignored", "timeout")
    assert outcome["time_to_outcome_ms"] >= IGNORE_AFTER_S * 1000


async def test_a_newer_request_supersedes(
    client: LanguageClient, workspace: Path, telemetry_backend: BackendServer
) -> None:
    doc = Document(client, workspace, "supersede")
    first, _ = await doc.suggest()
    second, _ = await doc.suggest()
    assert first != second
    (outcome,) = await stored(telemetry_backend, "outcome", first)
    assert outcome["kind"] == "superseded"


async def test_dismiss_notification(
    client: LanguageClient, workspace: Path, telemetry_backend: BackendServer
) -> None:
    doc = Document(client, workspace, "dismiss")
    decision_id, _ = await doc.suggest()
    client.protocol.notify("tabloop/didShow", {"decisionId": decision_id})
    client.protocol.notify("tabloop/didDismiss", {"decisionId": decision_id})
    (outcome,) = await stored(telemetry_backend, "outcome", decision_id)
    assert outcome["kind"] == "dismissed"


async def test_editor_switch_off_records_nothing(
    client: LanguageClient, workspace: Path, telemetry_backend: BackendServer
) -> None:
    doc = Document(client, workspace, "switch")
    client.protocol.notify("tabloop/telemetryEnabled", {"enabled": False})
    silent, _ = await doc.suggest()
    client.protocol.notify("tabloop/telemetryEnabled", {"enabled": True})
    loud, _ = await doc.suggest()
    assert await stored(telemetry_backend, "decision", loud)
    # Events leave in order: had the first been recorded, it would be there by now.
    assert await stored(telemetry_backend, "decision", silent, timeout=0) == []


async def test_metrics_level_sends_no_code_paths_or_identifiers(
    client: LanguageClient,
    telemetry_backend: BackendServer,
    model_server: tuple[str, ServerState],
) -> None:
    # Runs last in the module: every case above has sent its events by now.
    bodies = telemetry_backend.bodies
    assert bodies, "nothing was sent"
    decisions = telemetry_backend.storage.events(telemetry_backend.tenant_id, type="decision")
    assert len(decisions) >= 7
    for canary in (CANARY_IDENT, CANARY_TEXT, CANARY_DIR, CANARY_FILE, "separator", "kept"):
        for body in bodies:
            assert canary.encode() not in body, f"{canary!r} left the machine"
    for _, event in decisions:
        assert event["prompt"] is None and event["suggestion"] is None
        assert event["model_version"] == SERVED_VERSION  # as the completion server named it
    # The completion server was told the installation the events name (an adapter canary's
    # arm follows it), and nothing else that identifies the user.
    installs = {event["install_id"] for _, event in decisions}
    assert len(installs) == 1
    users = {request.get("user") for request in model_server[1].requests}
    assert users == installs
    status = plain(await client.protocol.send_request_async("tabloop/status", {}))
    assert status["telemetry"]["level"] == "metrics"
    assert status["telemetry"]["spool"]["dropped_events"] == 0
    assert status["telemetry"]["sender"]["sent_events"] >= len(decisions)
