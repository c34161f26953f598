"""`WorkspaceIndex`: the index of one workspace as a service for the language server.

All writing happens on one worker thread: it loads the embedding model, opens the index (as the
single writer, or read-only when another process writes it), scans, embeds in batches and then
follows edits. Between batches of the initial indexing it applies document updates first, so an
edit is searchable quickly even while a large workspace is still being embedded. Every public
method is thread-safe and returns at once (none waits for indexing); `search` answers from what
is indexed so far.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from indexer.atomic_files import WriterLock
from indexer.embed import CachedEmbedder, Embedder, EmbeddingCache
from indexer.embed_onnx import load_embedder
from indexer.pipeline import Indexer, IndexStats, Progress, chunker_for
from indexer.settings import IndexSettings
from indexer.store import CorruptIndex, IndexStore, index_dir
from indexer.types import Chunk, SearchHit, SymbolHit
from indexer.watch import WorkspaceWatcher

log = logging.getLogger(__name__)

SAVE_INTERVAL_S = 30.0
_REREAD = object()  # queue marker: take the file from disk
_REMOVE = object()  # queue marker: the file is gone


class WorkspaceIndex:
    """Semantic index of the files under `root`, kept in `cache_dir`.

    `embedder` replaces the model named by `settings.embedding_model` (tests pass small ones).
    """

    def __init__(
        self,
        root: Path,
        settings: IndexSettings,
        cache_dir: Path,
        *,
        embedder: Embedder | None = None,
    ) -> None:
        self.root = root.resolve()
        self.settings = settings
        self.cache_dir = cache_dir
        self.directory = index_dir(cache_dir, self.root)
        self._embedder = embedder
        self._cached: CachedEmbedder | None = None
        self._embed_cache: EmbeddingCache | None = None
        self._store: IndexStore | None = None
        self._indexer: Indexer | None = None
        self._lock = WriterLock(self.directory / "writer.lock")
        self._watcher: WorkspaceWatcher | None = None
        self._cond = threading.Condition()
        self._queue: dict[str, object] = {}  # path -> text | _REREAD | _REMOVE, coalesced
        self._rescan = False
        self._busy = False
        self._closing = False
        self._thread: threading.Thread | None = None
        self._state = "new"
        self._error = ""
        self._progress: tuple[str, int, int] = ("", 0, 0)
        self._progress_cb: Progress | None = None
        self.last_stats: IndexStats | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, progress: Progress | None = None) -> None:
        """Begin indexing in the background; `progress(stage, done, total)` is called from
        the worker thread, with stage `scan`, `index` (files) and finally `ready`, once per pass
        (`indexer.progress.StageProgress` shows them on a terminal)."""
        with self._cond:
            if self._thread is not None:
                return
            self._progress_cb = progress
            self._rescan = True
            self._state = "starting"
            self._thread = threading.Thread(target=self._run, name="tabloop-index", daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the worker, save the vectors, release the writer lock."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)
        if self._watcher is not None:
            self._watcher.close()
        store, self._store = self._store, None  # searches from now on answer empty
        if store is not None:
            try:
                store.save()
            except (OSError, sqlite3.Error):
                log.warning("could not save the index", exc_info=True)
            store.close()
        if self._embed_cache is not None:
            self._embed_cache.close()
        self._lock.release()
        self._state = "closed"

    def __enter__(self) -> WorkspaceIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until nothing is queued or running; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._state in ("new", "starting", "loading", "scanning", "indexing") or (
                self._state in ("ready",) and (self._queue or self._rescan or self._busy)
            ):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining if remaining is not None else 1.0)
        return True

    # -- the worker --------------------------------------------------------------------------

    def _set(self, state: str) -> None:
        with self._cond:
            self._state = state
            self._cond.notify_all()

    def _report(self, stage: str, done: int, total: int) -> None:
        self._progress = (stage, done, total)
        if self._progress_cb is not None:
            try:
                self._progress_cb(stage, done, total)
            except Exception:
                log.warning("progress callback failed", exc_info=True)

    def _open(self) -> None:
        self._set("loading")
        embedder = self._embedder or load_embedder(
            self.settings.embedding_model,
            cache_dir=self.cache_dir,
            batch_size=self.settings.embed_batch_size,
            engine=self.settings.embedding_engine,
        )
        self._embedder = embedder
        self._embed_cache = EmbeddingCache(self.cache_dir / "embeddings.sqlite3")
        self._cached = CachedEmbedder(embedder, self._embed_cache)
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "root.txt").write_text(str(self.root) + "\n", encoding="utf-8")
        writer = self._lock.acquire(self.settings.lock_timeout_s)
        try:
            store = IndexStore(
                self.directory,
                dimension=embedder.dimension,
                model_id=embedder.model_id,
                hnsw_threshold=self.settings.hnsw_threshold,
                readonly=not writer,
            )
        except CorruptIndex:
            if writer:
                raise
            self._store = None
            return
        self._store = store
        if writer:
            chunker = chunker_for(embedder, self.settings)
            self._indexer = Indexer(self.root, self.settings, store, self._cached, chunker)

    def _run(self) -> None:
        try:
            self._open()
        except Exception as exc:
            log.exception("the index could not be opened")
            self._error = str(exc)
            self._set("failed")
            return
        if self._indexer is None:
            self._set("readonly")
            return
        last_rescan = 0.0
        last_save = time.monotonic()
        while True:
            with self._cond:
                while not (self._closing or self._queue or self._rescan):
                    interval = self.settings.rescan_interval_s
                    timeout = SAVE_INTERVAL_S
                    if interval:
                        timeout = min(timeout, max(0.0, last_rescan + interval - time.monotonic()))
                    if not self._cond.wait(timeout):
                        break
                if self._closing:
                    return
                rescan = self._rescan or (
                    self.settings.rescan_interval_s > 0
                    and time.monotonic() - last_rescan >= self.settings.rescan_interval_s
                )
                self._rescan = False
                self._busy = True
            try:
                self._apply_documents()
                if rescan:
                    self._full_pass()
                    last_rescan = time.monotonic()
                if self._state != "ready":
                    self._start_watching()
                    self._set("ready")
                if time.monotonic() - last_save >= SAVE_INTERVAL_S and not self._queue:
                    self._store_save()
                    last_save = time.monotonic()
            except Exception as exc:
                log.exception("indexing failed")
                self._error = str(exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _full_pass(self) -> None:
        assert self._indexer is not None
        first = self._state != "ready"
        if first:
            self._set("scanning")
        self._report("scan", 0, 0)
        result = self._indexer.scan()
        self._report("scan", result.files_seen, result.files_seen)
        if first:
            self._set("indexing")
        self.last_stats = self._indexer.index_changes(result, self._report, self._apply_documents)
        self._store_save()
        files, _ = self._store.counts() if self._store is not None else (0, 0)
        self._report("ready", files, files)

    def _store_save(self) -> None:
        if self._store is not None:
            self._store.save()

    def _apply_documents(self) -> None:
        """Apply queued document updates (called between embedding batches too)."""
        assert self._indexer is not None
        while True:
            with self._cond:
                if not self._queue or self._closing:
                    return
                path = next(iter(self._queue))
                what = self._queue.pop(path)
            try:
                if what is _REMOVE:
                    self._indexer.remove(path)
                elif what is _REREAD:
                    self._indexer.update_path(path)
                else:
                    self._indexer.update_text(path, str(what))
            except Exception:
                log.warning("could not index %s", path, exc_info=True)

    def _start_watching(self) -> None:
        if not self.settings.watch or self._watcher is not None:
            return
        try:
            watcher = WorkspaceWatcher(
                self.root, self.settings.debounce_ms / 1000, self._on_files, self.rescan
            )
            watcher.start()
            self._watcher = watcher
        except OSError:  # e.g. inotify watches exhausted: periodic rescans still repair
            log.warning("cannot watch %s; relying on periodic rescans", self.root, exc_info=True)

    def _on_files(self, paths: list[str]) -> None:
        with self._cond:
            for rel in paths:
                if self._indexer is not None and rel in self._indexer.overlays:
                    continue  # an open, modified buffer wins over the disk until saved or closed
                self._queue[rel] = _REREAD
            self._cond.notify_all()

    # -- the API for the server --------------------------------------------------------------

    def _rel(self, path: Path | str) -> str | None:
        candidate = Path(path)
        if not candidate.is_absolute():
            candidate = self.root / candidate
        try:
            rel = candidate.resolve().relative_to(self.root).as_posix()
        except (ValueError, OSError):
            return None
        return None if rel in ("", ".") else rel

    def update_document(self, path: Path | str, text: str | None) -> None:
        """An editor's view of a file: its unsaved `text`, or None to take it from disk (after
        a save or a close)."""
        rel = self._rel(path)
        if rel is None or self._state in ("readonly", "failed", "closed"):
            return  # only the writer applies updates
        with self._cond:
            self._queue[rel] = _REREAD if text is None else text
            self._cond.notify_all()

    def remove(self, path: Path | str) -> None:
        """Forget a file (deleted or renamed away)."""
        rel = self._rel(path)
        if rel is None or self._state in ("readonly", "failed", "closed"):
            return
        with self._cond:
            self._queue[rel] = _REMOVE
            self._cond.notify_all()

    def rescan(self) -> None:
        """Ask for a rescan of the whole workspace (cheap when little changed)."""
        with self._cond:
            self._rescan = True
            self._cond.notify_all()

    def search(self, query: str, k: int = 10, path_prefix: str = "") -> list[SearchHit]:
        """The `k` chunks closest in meaning to `query`; empty until the model is loaded."""
        store, embedder = self._store, self._embedder
        if store is None or embedder is None or not query.strip() or self._cached is None:
            return []
        vector = embedder.embed([query])[0]
        try:
            return store.search(vector, k, path_prefix)
        except sqlite3.ProgrammingError:  # closed while we embedded the query
            return []

    def symbols(self, query: str, k: int = 50, *, by_meaning: bool = True) -> list[SymbolHit]:
        """Symbols by name (exact, prefix, substring), then (`by_meaning`) symbols of chunks
        close in meaning. Without `by_meaning` no query is embedded: a name lookup only."""
        store = self._store
        if store is None:
            return []
        found = store.symbols_named(query, k)
        if by_meaning and len(found) < k and len(query.strip()) > 2:
            seen = {(s.path, s.line, s.name) for s in found}
            for hit in self.search(query, k=max(5, k - len(found))):
                for symbol in store.chunk_symbols(hit.path, hit.start_line, hit.end_line):
                    key = (hit.path, symbol.line, symbol.name)
                    if key not in seen:
                        seen.add(key)
                        found.append(
                            SymbolHit(
                                symbol.name,
                                symbol.kind,
                                hit.path,
                                symbol.line,
                                symbol.container,
                                hit.score * 0.5,
                            )
                        )
        return found[:k]

    def chunk_at(self, path: Path | str, line: int) -> Chunk | None:
        """The indexed chunk holding 0-based `line` of `path`, or None."""
        rel = self._rel(path)
        store = self._store
        return None if rel is None or store is None else store.chunk_at(rel, line)

    def status(self) -> dict[str, Any]:
        """State, counts and progress, for `tabloop/status` and logs."""
        store = self._store
        files, chunks = store.counts() if store is not None else (0, 0)
        stage, done, total = self._progress
        indexer = self._indexer
        # Flat, JSON-ready keys: the server passes this on as the `index` part of tabloop/status.
        return {
            "root": str(self.root),
            "state": self._state,
            "files": files,
            "chunks": chunks,
            "stage": stage,
            "done": done,
            "total": total,
            "queued": len(self._queue),
            "merkleRoot": indexer.tree.root_hash.hex() if indexer is not None else "",
            "writer": self._lock.held,
            "error": self._error,
            "recovered": list(store.recovered) if store is not None else [],
            # What runs the embedding model (`onnxruntime`, `sentence-transformers`).
            "embeddingEngine": getattr(self._embedder, "engine", ""),
        }

    @property
    def indexer(self) -> Indexer | None:
        """The writer (None until opened, or when read-only): Merkle tree and stat cache."""
        return self._indexer

    @property
    def store(self) -> IndexStore | None:
        return self._store


def index_workspace(
    root: Path,
    settings: IndexSettings,
    cache_dir: Path,
    progress: Progress | None = None,
    embedder: Embedder | None = None,
) -> tuple[WorkspaceIndex, IndexStats | None]:
    """Index `root` once in the foreground (for the CLI and the demo); the caller closes it."""
    quiet = settings.model_copy(update={"watch": False, "rescan_interval_s": 0.0})
    index = WorkspaceIndex(root, quiet, cache_dir, embedder=embedder)
    index.start(progress)
    index.wait_idle()
    return index, index.last_stats
