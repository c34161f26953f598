"""A small LSP client for the demo and the benchmarks: starts the real server over stdio."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.lsp.client import LanguageClient

from common.languages import lsp_id_for_path
from lsp_server.main import LISTENING_MESSAGE
from lsp_server.protocol import STATUS_REQUEST

DEFAULT_CAPABILITIES = types.ClientCapabilities(
    text_document=types.TextDocumentClientCapabilities(
        inline_completion=types.InlineCompletionClientCapabilities(),
        synchronization=types.TextDocumentSyncClientCapabilities(did_save=True),
    ),
    window=types.WindowClientCapabilities(work_done_progress=True),
)


def plain(value: Any) -> Any:
    """pygls hands custom responses back as named tuples; make them plain data."""
    if hasattr(value, "_asdict"):
        return {k: plain(v) for k, v in value._asdict().items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


class TabloopClient(LanguageClient):
    """An editor stand-in: opens documents, asks for suggestions, accepts them."""

    def __init__(self, *, echo: bool = False) -> None:
        super().__init__("tabloop-client", "1")
        self.messages: list[str] = []
        self.echo = echo
        self._versions: dict[str, int] = {}
        self.stderr_lines: list[str] = []
        self._stderr_task: asyncio.Task[None] | None = None

        @self.feature(types.WINDOW_SHOW_MESSAGE)
        def show(params: types.ShowMessageParams) -> None:
            self.messages.append(params.message)
            if self.echo:
                print(f"  [server] {params.message}")

        @self.feature(types.WINDOW_LOG_MESSAGE)
        def log(params: types.LogMessageParams) -> None:
            if self.echo and params.type <= types.MessageType.Warning:
                print(f"  [server log] {params.message}")

        @self.feature(types.WINDOW_WORK_DONE_PROGRESS_CREATE)
        def create(params: types.WorkDoneProgressCreateParams) -> None:
            return None

        @self.feature(types.PROGRESS)
        def progress(params: types.ProgressParams) -> None:
            if not self.echo:
                return
            value = plain(params.value)
            if isinstance(value, dict):
                words = [str(value[k]) for k in ("title", "message") if value.get(k)]
                if "percentage" in value and value["percentage"] is not None:
                    words.append(f"{value['percentage']}%")
                if words:
                    print(f"  [progress] {' '.join(words)}")

    async def launch(
        self,
        root: Path | None,
        init_options: dict[str, Any] | None = None,
        *,
        capabilities: types.ClientCapabilities = DEFAULT_CAPABILITIES,
        env: dict[str, str] | None = None,
        server_args: tuple[str, ...] = (),
        wait_until_listening: bool = False,
    ) -> float:
        """Start `python -m lsp_server`, initialize; returns initialize's round trip in ms.

        With `wait_until_listening`, `initialize` is sent only once the server says it reads
        stdin, so the figure leaves out the interpreter's start-up and imports.
        """
        await self.start_io(
            sys.executable,
            "-m",
            "lsp_server",
            "--stdio",
            "-v",  # info on stderr too, which this client reads: the listening line is info
            *server_args,
            env=env or dict(os.environ),
        )
        await self._follow_stderr(wait_until_listening)
        started = time.perf_counter()
        await self.initialize_async(
            types.InitializeParams(
                capabilities=capabilities,
                root_uri=root.as_uri() if root else None,
                workspace_folders=(
                    [types.WorkspaceFolder(uri=root.as_uri(), name=root.name)] if root else None
                ),
                initialization_options=init_options or {},
            )
        )
        elapsed_ms = (time.perf_counter() - started) * 1000
        self.initialized(types.InitializedParams())
        return elapsed_ms

    async def _follow_stderr(self, wait_until_listening: bool) -> None:
        """Drain the server's stderr (a full pipe would block it); echo it when asked."""
        process = self._server
        assert process is not None and process.stderr is not None
        stream = process.stderr
        listening = asyncio.Event()

        async def drain() -> None:
            async for raw in stream:
                line = raw.decode("utf-8", "replace").rstrip()
                self.stderr_lines.append(line)
                if LISTENING_MESSAGE in line:
                    listening.set()
            listening.set()  # the process ended; don't wait forever

        self._stderr_task = asyncio.get_running_loop().create_task(drain())
        if wait_until_listening:
            await asyncio.wait_for(listening.wait(), timeout=60)

    async def status(self) -> dict[str, Any]:
        result: dict[str, Any] = plain(await self.protocol.send_request_async(STATUS_REQUEST, {}))
        return result

    async def wait_until_ready(self, timeout_s: float = 900.0) -> dict[str, Any]:
        """Poll `tabloop/status` until the model is ready (or failed, or time is up)."""
        deadline = time.monotonic() + timeout_s
        while True:
            status = await self.status()
            if status["model"]["state"] in ("ready", "error", "disabled"):
                return status
            if time.monotonic() > deadline:
                return status
            await asyncio.sleep(0.2)

    def open(self, path: Path, text: str, language: str | None = None) -> str:
        """Open `path` with `text`, as an editor would: with the LSP id of its extension unless
        `language` names one."""
        uri = path.as_uri()
        self._versions[uri] = 1
        self.text_document_did_open(
            types.DidOpenTextDocumentParams(
                text_document=types.TextDocumentItem(
                    uri=uri,
                    language_id=language or lsp_id_for_path(str(path)),
                    version=1,
                    text=text,
                )
            )
        )
        return uri

    def insert(self, uri: str, line: int, character: int, text: str) -> None:
        """Type `text` at a position (an incremental change)."""
        self._versions[uri] += 1
        position = types.Position(line=line, character=character)
        self.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(
                    uri=uri, version=self._versions[uri]
                ),
                content_changes=[
                    types.TextDocumentContentChangePartial(
                        range=types.Range(start=position, end=position), text=text
                    )
                ],
            )
        )

    def close(self, uri: str) -> None:
        self.text_document_did_close(
            types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )

    async def inline(
        self, uri: str, line: int, character: int, *, invoked: bool = True
    ) -> list[types.InlineCompletionItem]:
        answer = await self.text_document_inline_completion_async(
            types.InlineCompletionParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                position=types.Position(line=line, character=character),
                context=types.InlineCompletionContext(
                    trigger_kind=(
                        types.InlineCompletionTriggerKind.Invoked
                        if invoked
                        else types.InlineCompletionTriggerKind.Automatic
                    )
                ),
            )
        )
        if isinstance(answer, types.InlineCompletionList):
            return list(answer.items)
        return list(answer or [])

    async def accept(self, item: types.InlineCompletionItem) -> None:
        if item.command is not None:
            await self.workspace_execute_command_async(
                types.ExecuteCommandParams(
                    command=item.command.command, arguments=item.command.arguments
                )
            )

    async def close_server(self) -> None:
        await self.shutdown_async(None)
        self.exit(None)
        await self.stop()


def item_text(item: types.InlineCompletionItem) -> str:
    text = item.insert_text
    return text if isinstance(text, str) else text.value
