"""The workspace index in the server: `workspace/symbol`, `tabloop/search`, progress, edits.

The index (`indexer.service.WorkspaceIndex`) starts in the background once the settings are
known, reports `$/progress` while it scans and embeds, follows document changes (debounced) and
saves, and is found by the completion context as `server.feature_of(IndexFeature).index`; its
state is the `index` (and `sync`) part of `tabloop/status`. Nothing here blocks the event loop:
searches embed their query on a worker thread, and the index does its own writing on its own
thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.uris import from_fs_path, to_fs_path

from indexer.embed_onnx import runs_in_onnx
from indexer.service import WorkspaceIndex
from indexer.sync import IndexSyncer
from indexer.sync_setup import syncer_for_index
from indexer.types import SearchHit as IndexHit
from indexer.types import SymbolHit
from lsp_server.config import Settings
from lsp_server.documents import DocumentChange, DocumentListener, open_document
from lsp_server.progress import WorkDoneProgress
from lsp_server.protocol import (
    INDEX_PROGRESS_TITLE,
    INDEX_PROGRESS_TOKEN_PREFIX,
    SEARCH_REQUEST,
    SearchHit,
    SearchParams,
    read_params,
    to_wire,
)
from lsp_server.server import TabloopServer

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 0.25
CLOSE_WAIT_S = 5.0

SYMBOL_KINDS = {
    "function": types.SymbolKind.Function,
    "method": types.SymbolKind.Method,
    "constructor": types.SymbolKind.Constructor,
    "class": types.SymbolKind.Class,
    "struct": types.SymbolKind.Struct,
    "enum": types.SymbolKind.Enum,
    "interface": types.SymbolKind.Interface,
    "type": types.SymbolKind.Class,
    "module": types.SymbolKind.Module,
    "namespace": types.SymbolKind.Namespace,
    "macro": types.SymbolKind.Function,
    "variable": types.SymbolKind.Variable,
}


class IndexFeature(DocumentListener):
    """Owns the server's `WorkspaceIndex`: starts, restarts and closes it, feeds it edits."""

    def __init__(self, server: TabloopServer) -> None:
        self.server = server
        self.index: WorkspaceIndex | None = None
        self.syncer: IndexSyncer | None = None
        self._key: tuple[Any, ...] | None = None
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._progress: WorkDoneProgress | None = None
        self._last_report = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    def on_settings(self, settings: Settings) -> None:
        root = self.server.workspace_root
        enabled = bool(settings.index.enabled) and root is not None
        key = (str(root), settings.index.model_dump_json(), str(settings.cache_path()))
        if enabled and key == self._key:
            return
        self._close_index()
        if not enabled or root is None:
            return
        self._key = key
        index = WorkspaceIndex(Path(root), settings.index, settings.cache_path())
        self.index = index
        loop = asyncio.get_event_loop()

        def progress(stage: str, done: int, total: int) -> None:
            # Called on the index's worker thread: hand over to the event loop.
            loop.call_soon_threadsafe(self._on_progress, index, stage, done, total)

        torch = not runs_in_onnx(settings.index.embedding_model, settings.index.embedding_engine)

        def start() -> None:
            if torch:  # sentence-transformers: not alongside the model's imports
                self.server.import_libraries()
            if self.index is index:  # not closed (a settings change) in the meantime
                index.start(progress)

        threading.Thread(target=start, name="tabloop-index-start", daemon=True).start()
        log.info("indexing %s", root)
        backend = settings.backend
        if settings.index.sync and backend.url:
            # Keyed Merkle sync with the backend: ids, ranges and vectors only, never code.
            syncer = syncer_for_index(
                index, backend.url, backend.token, secret=settings.index.sync_secret
            )
            syncer.start()
            self.syncer = syncer

    def _close_index(self) -> None:
        index, self.index, self._key = self.index, None, None
        syncer, self.syncer = self.syncer, None
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

        def close() -> None:
            if syncer is not None:
                syncer.close()  # before the index it reads from
            if index is not None:
                index.close()

        if index is not None or syncer is not None:
            # Closing waits for the batch being embedded; do not hold the event loop for it.
            closer = threading.Thread(target=close, name="tabloop-index-close", daemon=True)
            closer.start()
            closer.join(CLOSE_WAIT_S)

    def on_shutdown(self) -> None:
        self._close_index()

    def status_parts(self) -> dict[str, Any]:
        """The `index` and `sync` parts of `tabloop/status`, while they run."""
        parts: dict[str, Any] = {}
        if self.index is not None:
            parts["index"] = self.index.status()
        if self.syncer is not None:
            parts["sync"] = self.syncer.status()
        return parts

    # -- progress ----------------------------------------------------------------------------

    def _on_progress(self, index: WorkspaceIndex, stage: str, done: int, total: int) -> None:
        if index is not self.index or not self.server.client.work_done_progress:
            return
        if stage == "ready":
            if self._progress is not None:
                progress, self._progress = self._progress, None
                progress.end(f"{done} files indexed")
            return
        now = time.monotonic()
        if self._progress is not None and now - self._last_report < PROGRESS_INTERVAL_S:
            return
        self._last_report = now
        message = "scanning" if stage == "scan" else f"indexing {done}/{total} files"
        percentage = int(100 * done / total) if stage == "index" and total else None
        if self._progress is None:
            self._progress = WorkDoneProgress(
                self.server, INDEX_PROGRESS_TOKEN_PREFIX, INDEX_PROGRESS_TITLE
            )
            self.server.run_task(self._progress.begin(message, percentage=0), "index-progress")
        else:
            self._progress.report(message, percentage)

    # -- documents (a `DocumentListener`) ----------------------------------------------------

    # An opened document is indexed already from its file; its edits arrive as changes.

    def did_change(self, change: DocumentChange) -> None:
        index, uri = self.index, change.uri
        if index is None:
            return
        timer = self._timers.pop(uri, None)
        if timer is not None:
            timer.cancel()
        delay = index.settings.debounce_ms / 1000
        loop = asyncio.get_event_loop()
        self._timers[uri] = loop.call_later(delay, self._flush, uri)

    def _flush(self, uri: str) -> None:
        self._timers.pop(uri, None)
        index, path = self.index, _path(uri)
        document = open_document(self.server.workspace, uri)
        if index is not None and path is not None and document is not None:
            index.update_document(path, document.source)

    def did_save(self, uri: str) -> None:
        self._from_disk(uri)

    def did_close(self, uri: str) -> None:
        self._from_disk(uri)  # unsaved changes are gone with the buffer

    def _from_disk(self, uri: str) -> None:
        timer = self._timers.pop(uri, None)
        if timer is not None:
            timer.cancel()
        index, path = self.index, _path(uri)
        if index is not None and path is not None:
            index.update_document(path, None)

    # -- requests ----------------------------------------------------------------------------

    async def search(self, query: str, k: int) -> list[IndexHit]:
        index = self.index
        if index is None or not query.strip():
            return []
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, index.search, query, k)

    async def symbols(self, query: str) -> list[SymbolHit]:
        index = self.index
        if index is None or not query.strip():
            return []
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, index.symbols, query, 100)

    def uri_of(self, rel: str) -> str:
        index = self.index
        root = index.root if index is not None else Path(".")
        return from_fs_path(str(root / rel)) or ""


def _path(uri: str) -> Path | None:
    path = to_fs_path(uri)
    return Path(path) if path else None


def search_hit(feature: IndexFeature, hit: IndexHit) -> SearchHit:
    """An index hit on the wire: whole lines of a file, its score, a preview and its symbols."""
    return SearchHit(
        uri=feature.uri_of(hit.path),
        range=types.Range(
            start=types.Position(line=hit.start_line, character=0),
            end=types.Position(line=hit.end_line, character=0),
        ),
        score=round(hit.score, 4),
        preview=hit.preview,
        symbols=list(hit.symbols),
    )


def register(server: TabloopServer) -> None:
    feature = server.add_feature(IndexFeature(server))
    server.hooks.settings.append(feature.on_settings)
    server.hooks.documents.append(feature)
    server.hooks.shutdown.append(feature.on_shutdown)

    @server.feature(SEARCH_REQUEST)
    async def search(ls: TabloopServer, params: Any) -> list[dict[str, Any]]:
        """`SearchParams` → the k chunks closest in meaning, best first."""
        try:
            request = read_params(params, SearchParams)
            if request is None:
                return []
            found = await feature.search(request.text(), request.limit())
            wire: list[dict[str, Any]] = to_wire([search_hit(feature, hit) for hit in found])
            return wire
        except Exception:
            log.warning("%s failed", SEARCH_REQUEST, exc_info=True)
            return []

    @server.feature(types.WORKSPACE_SYMBOL)
    async def workspace_symbol(
        ls: TabloopServer, params: types.WorkspaceSymbolParams
    ) -> list[types.WorkspaceSymbol]:
        """Symbols by name, then by meaning, from the index."""
        try:
            found = await feature.symbols(params.query)
        except Exception:
            log.warning("workspace/symbol failed", exc_info=True)
            return []
        return [
            types.WorkspaceSymbol(
                name=symbol.name,
                kind=SYMBOL_KINDS.get(symbol.kind, types.SymbolKind.Variable),
                container_name=symbol.container or None,
                location=types.Location(
                    uri=feature.uri_of(symbol.path),
                    range=types.Range(
                        start=types.Position(line=symbol.line, character=0),
                        end=types.Position(line=symbol.line, character=0),
                    ),
                ),
            )
            for symbol in found
        ]
