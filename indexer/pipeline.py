"""The indexing pipeline: scan ▶ read and hash ▶ Merkle ▶ chunk ▶ embed ▶ store.

`Indexer` is the single writer of one workspace's index. It is not thread-safe: the service runs
it on one worker thread while searches read the store.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from indexer.chunking import Chunker
from indexer.embed import CachedEmbedder, Embedder
from indexer.ignore import is_excluded
from indexer.merkle import MerkleTree
from indexer.scan import FileContent, FileStat, Scanner, ScanResult, is_binary, leaf_hash, read_file
from indexer.secrets import find_secret
from indexer.settings import IndexSettings
from indexer.store import FileUpdate, IndexStore
from indexer.types import Chunk

log = logging.getLogger(__name__)

Progress = Callable[[str, int, int], None]
"""`progress(stage, done, total)`, stages in order: `scan` (files seen), `index` (files read,
from 0 of the changed files up to all of them) and `ready`; see `indexer.progress`."""


def chunker_for(embedder: Embedder, settings: IndexSettings) -> Chunker:
    """The chunker the index uses with `embedder` (equal settings give equal chunk ids)."""
    max_tokens = settings.chunk_max_tokens or embedder.max_tokens
    return Chunker(
        embedder.counter,
        max_tokens=min(max_tokens, embedder.max_tokens),
        min_tokens=settings.chunk_min_tokens,
        overlap_lines=settings.window_overlap_lines,
    )


@dataclass
class IndexStats:
    """What one indexing pass did (the `tabloop index --json` figures)."""

    files_scanned: int = 0
    files_changed: int = 0
    files_removed: int = 0
    chunks_total: int = 0
    chunks_embedded: int = 0
    chunks_reused: int = 0
    seconds: float = 0.0
    files_denied: int = 0  # names or link targets on the deny list (directories count once)
    links_outside: int = 0  # links not followed: their target lies outside the workspace
    files_skipped: dict[str, int] = field(default_factory=dict)  # read but not indexed, by why


@dataclass
class _Pending:
    path: str
    stat: FileStat
    chunks: list[Chunk]


class Indexer:
    """Keeps the index of one workspace equal to its files (and open unsaved buffers)."""

    def __init__(
        self,
        root: Path,
        settings: IndexSettings,
        store: IndexStore,
        embedder: CachedEmbedder,
        chunker: Chunker,
    ) -> None:
        self.root = root
        self.settings = settings
        self.store = store
        self.embedder = embedder
        self.chunker = chunker
        self.scanner = Scanner(
            root, exclude=settings.exclude, follow_symlinks=settings.follow_symlinks
        )
        self.cache = store.stat_cache()
        self.tree = MerkleTree.from_leaves(store.leaves())
        self.overlays: set[str] = set()  # paths whose index content is an unsaved buffer

    def scan(self) -> ScanResult:
        """Walk the workspace and persist directory listings; reads no file contents."""
        result = self.scanner.scan(self.cache)
        if result.touched_dirs or result.dirs_listed:
            self.store.save_listings(self.cache, set(result.touched_dirs))
        return result

    def index_changes(
        self,
        result: ScanResult,
        progress: Progress | None = None,
        between_batches: Callable[[], None] | None = None,
    ) -> IndexStats:
        """Index what a scan found changed; embeds in batches and commits after each batch."""
        started = time.perf_counter()
        embedded, reused = self.embedder.embedded, self.embedder.reused
        stats = IndexStats(
            files_scanned=result.files_seen,
            files_denied=result.denied,
            links_outside=result.links_outside,
        )
        removed = [p for p in result.removed if p not in self.overlays]
        if removed:
            for path in removed:
                self.tree.remove_file(path)
                self.cache.files.pop(path, None)
            self.store.apply([], removed, self.tree.root_hash)
        stats.files_removed = len(removed)
        changed = [p for p in result.changed if p not in self.overlays]
        pending: list[_Pending] = []
        untouched: dict[str, FileStat] = {}
        waiting = 0
        if progress is not None and changed:
            # The stage begins now, with its total, not when the first batch is embedded.
            progress("index", 0, len(changed))
        for done, path in enumerate(changed, 1):
            content = read_file(self.root, path, self.settings.max_file_bytes)
            if content.stat.skip:
                skip = content.stat.skip
                stats.files_skipped[skip] = stats.files_skipped.get(skip, 0) + 1
            old = self.cache.files.get(path)
            if (
                old is not None
                and old.digest == content.stat.digest
                and old.skip == content.stat.skip
            ):
                untouched[path] = content.stat
                self.cache.files[path] = content.stat
            else:
                stats.files_changed += 1
                chunks = self._chunks(content)
                pending.append(_Pending(path, content.stat, chunks))
                waiting += len(chunks)
            if waiting >= self.settings.embed_batch_size or done == len(changed):
                self._commit(pending)
                pending, waiting = [], 0
                if progress is not None:
                    progress("index", done, len(changed))
                if between_batches is not None:
                    between_batches()
        if untouched:
            self.store.update_stats(untouched)
        stats.chunks_total = self.store.counts()[1]
        stats.chunks_embedded = self.embedder.embedded - embedded
        stats.chunks_reused = self.embedder.reused - reused
        stats.seconds = time.perf_counter() - started
        return stats

    def _chunks(self, content: FileContent) -> list[Chunk]:
        if content.data is None:
            return []
        try:
            return self.chunker.chunk(content.rel_path, content.text)
        except Exception:  # a grammar bug must not stop the index: keep the file unindexed
            log.warning("could not chunk %s", content.rel_path, exc_info=True)
            return []

    def _commit(self, pending: list[_Pending]) -> None:
        if not pending:
            return
        chunks = [chunk for item in pending for chunk in item.chunks]
        ids = [chunk.id for chunk in chunks]
        known = self.store.known_vectors(ids)
        vectors = self.embedder.vectors(ids, [chunk.text for chunk in chunks], known)
        updates = [FileUpdate(i.path, i.stat, i.chunks, vectors) for i in pending]
        for item in pending:
            self.cache.files[item.path] = item.stat
            if item.stat.digest is not None:
                self.tree.set_file(item.path, item.stat.digest)
            else:
                self.tree.remove_file(item.path)
        self.store.apply(updates, [], self.tree.root_hash)

    def rel_path(self, path: Path) -> str | None:
        """`path` relative to the root with `/` separators, or None when outside it."""
        try:
            rel = Path(os.path.abspath(path)).relative_to(os.path.abspath(self.root))
        except ValueError:
            return None
        text = rel.as_posix()
        return None if text in ("", ".") else text

    def update_text(self, rel: str, text: str) -> bool:
        """Index an unsaved buffer's text for `rel`; False when the path is not indexable."""
        if self._excluded(rel):
            return False
        data = text.encode("utf-8")
        if len(data) > self.settings.max_file_bytes or is_binary(data) or find_secret(data):
            return False
        self.overlays.add(rel)
        stat = FileStat(-1, len(data), 0, leaf_hash(data))
        old = self.cache.files.get(rel)
        if old is not None and old.digest == stat.digest:
            return True
        self._commit([_Pending(rel, stat, self._chunks(FileContent(rel, stat, data)))])
        return True

    def update_path(self, rel: str) -> None:
        """Re-read `rel` from disk (dropping any unsaved buffer), or forget it when gone."""
        self.overlays.discard(rel)
        path = self.root / rel
        if not path.is_file() or self._excluded(rel):
            self.remove(rel)
            return
        content = read_file(self.root, rel, self.settings.max_file_bytes)
        old = self.cache.files.get(rel)
        if old is not None and old.digest == content.stat.digest and old.skip == content.stat.skip:
            self.cache.files[rel] = content.stat
            self.store.update_stats({rel: content.stat})
            return
        self._commit([_Pending(rel, content.stat, self._chunks(content))])

    def _excluded(self, rel: str) -> bool:
        """The scan's rules for one path, links and deny list included."""
        return is_excluded(self.root, rel, self.settings.exclude, self.settings.follow_symlinks)

    def remove(self, rel: str) -> None:
        """Drop a file from the index."""
        self.overlays.discard(rel)
        if self.cache.files.pop(rel, None) is None:
            return
        self.tree.remove_file(rel)
        self.store.apply([], [rel], self.tree.root_hash)
