"""The client side of the index sync: keyed Merkle diff, upload of what the server lacks.

`sync_index(store, keys, client, workspace)` brings the server's copy of one workspace's index
equal to the local one:

1. ask for the server's root; equal to the local keyed root: done;
2. walk down only differing directories, one request per tree level (`children` of a batch of
   directory ids); files whose keyed leaf differs are uploaded, server nodes the client lacks are
   removed (a whole subtree in one id);
3. for the uploaded files, ask which chunk keys the tenant's store already has and send only the
   other vectors;
4. apply in bounded batches; the last one claims the client's root, which the server recomputes
   and compares.

`IndexSyncer` runs this in the background for the language server (after local index updates,
debounced; on a schedule; on demand), and `prefetch_vectors` fills the embedding cache of a fresh
clone from the server so the indexer embeds only what nobody on the team has embedded yet.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from common.http import Backoff
from indexer.embed import Embedder, EmbeddingCache
from indexer.merkle import MerkleNode, MerkleTree
from indexer.pipeline import chunker_for
from indexer.scan import Scanner, StatCache, read_file
from indexer.settings import IndexSettings
from indexer.store import IndexStore
from indexer.sync_client import SyncClient, SyncFailed, SyncRejected, encode_vectors
from indexer.sync_keys import SyncKeys
from indexer.sync_protocol import ApplyRequest, Upsert

log = logging.getLogger(__name__)

CHILDREN_BATCH = 1024
KEYS_BATCH = 4096
FILES_PER_APPLY = 1024
VECTORS_PER_APPLY = 1024


class IndexChanged(RuntimeError):
    """The local index changed under the sync (a file's chunks lost their vectors); retry."""


@dataclass
class SyncReport:
    """What one sync did and what it cost on the wire."""

    root: str = ""  # keyed root, now on the server too
    local_root: str = ""  # the plain Merkle root of the index state that was synced
    in_sync_before: bool = False
    files_uploaded: int = 0
    paths_removed: int = 0
    chunks_placed: int = 0
    vectors_uploaded: int = 0
    vectors_reused: int = 0
    node_hashes_received: int = 0
    levels_walked: int = 0
    requests: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Walk:
    upserts: list[str] = field(default_factory=list)  # keyed file paths
    removes: list[str] = field(default_factory=list)  # keyed node paths
    hashes: int = 0
    levels: int = 0


def _files_under(node: MerkleNode, path: str) -> list[str]:
    if node.children is None:
        return [path]
    out: list[str] = []
    for name, child in node.children.items():
        out.extend(_files_under(child, f"{path}/{name}" if path else name))
    return out


def walk_differences(client: SyncClient, tree: MerkleTree, workspace: str, model: str) -> _Walk:
    """Compare the local keyed tree with the server's, level by level, differing dirs only."""
    found = _Walk()
    frontier = [""]
    while frontier:
        found.levels += 1
        next_frontier: list[str] = []
        for start in range(0, len(frontier), CHILDREN_BATCH):
            batch = frontier[start : start + CHILDREN_BATCH]
            listing = client.children(workspace, model, batch)
            for directory in batch:
                node = tree.node(directory)
                assert node is not None and node.children is not None
                server = {name: (digest, is_dir) for name, digest, is_dir in listing[directory]}
                found.hashes += len(server)
                for name, child in node.children.items():
                    path = f"{directory}/{name}" if directory else name
                    theirs = server.get(name)
                    if theirs is not None and theirs == (child.hash.hex(), child.is_dir):
                        continue
                    if theirs is not None and theirs[1] and child.is_dir:
                        next_frontier.append(path)
                    else:  # new, or a file where they have a directory (or the reverse)
                        found.upserts.extend(_files_under(child, path))
                for name in server.keys() - node.children.keys():
                    found.removes.append(f"{directory}/{name}" if directory else name)
        frontier = next_frontier
    return found


def _chunk_rows(
    store: IndexStore, keys: SyncKeys, plain: str
) -> tuple[list[tuple[str, int, int]], dict[str, str]]:
    """A file's placements `(chunk key, start, end)` and `{chunk key: chunk id}`."""
    rows: list[tuple[str, int, int]] = []
    ids: dict[str, str] = {}
    for chunk in store.chunks_of(plain):
        if chunk.end_line <= chunk.start_line:
            continue
        key = keys.chunk(chunk.id)
        ids[key] = chunk.id
        rows.append((key, chunk.start_line, chunk.end_line))
    return rows, ids


def sync_index(
    store: IndexStore,
    keys: SyncKeys,
    client: SyncClient,
    workspace: str,
    *,
    dtype: str = "float16",
) -> SyncReport:
    """Make the server's copy of `store` equal to it (see the module docstring)."""
    started = time.perf_counter()
    before = (client.stats.requests, client.stats.bytes_sent, client.stats.bytes_received)
    model = keys.model(store.model_id)
    leaves = store.leaves()
    tree, plain_of = keys.tree(leaves)
    keyed_root = tree.root_hash.hex()
    report = SyncReport(root=keyed_root, local_root=MerkleTree.from_leaves(leaves).root_hash.hex())
    if client.root(workspace, model) == keyed_root:
        report.in_sync_before = True
    else:
        found = walk_differences(client, tree, workspace, model)
        report.node_hashes_received = found.hashes
        report.levels_walked = found.levels
        _upload(store, keys, client, workspace, model, tree, plain_of, found, dtype, report)
    report.requests = client.stats.requests - before[0]
    report.bytes_sent = client.stats.bytes_sent - before[1]
    report.bytes_received = client.stats.bytes_received - before[2]
    report.seconds = time.perf_counter() - started
    return report


def _upload(
    store: IndexStore,
    keys: SyncKeys,
    client: SyncClient,
    workspace: str,
    model: str,
    tree: MerkleTree,
    plain_of: dict[str, str],
    found: _Walk,
    dtype: str,
    report: SyncReport,
) -> None:
    files: list[Upsert] = []
    chunk_ids: dict[str, str] = {}
    for path in found.upserts:
        node = tree.node(path)
        assert node is not None
        rows, ids = _chunk_rows(store, keys, plain_of[path])
        chunk_ids.update(ids)
        files.append(Upsert(path=path, leaf=node.hash.hex(), chunks=rows))
        report.chunks_placed += len(rows)
    wanted = list(chunk_ids)
    held: set[str] = set()
    for start in range(0, len(wanted), KEYS_BATCH):
        held |= client.known(model, wanted[start : start + KEYS_BATCH])
    missing = [key for key in wanted if key not in held]
    report.vectors_reused = len(held)
    local = store.known_vectors([chunk_ids[k] for k in missing])
    if len(local) < len({chunk_ids[k] for k in missing}):
        raise IndexChanged("chunks lost their vectors while syncing")
    vectors = {key: local[chunk_ids[key]] for key in missing}
    batches = _batches(files, vectors)
    removes = list(found.removes)
    for number, (batch_files, batch_vectors) in enumerate(batches):
        last = number == len(batches) - 1
        client.apply(
            ApplyRequest(
                workspace=workspace,
                model=model,
                upserts=batch_files,
                removes=removes if number == 0 else [],
                vectors=encode_vectors(batch_vectors, dtype) if batch_vectors else None,
                root=tree.root_hash.hex() if last else None,  # only a whole sync claims a root
            )
        )
    report.files_uploaded = len(files)
    report.paths_removed = len(removes)
    report.vectors_uploaded = len(vectors)


def _batches(
    files: list[Upsert], vectors: dict[str, np.ndarray]
) -> list[tuple[list[Upsert], dict[str, np.ndarray]]]:
    """Apply messages: vectors go with (or before) the first file that places them."""
    out: list[tuple[list[Upsert], dict[str, np.ndarray]]] = []
    pending = dict(vectors)
    current: tuple[list[Upsert], dict[str, np.ndarray]] = ([], {})
    for item in files:
        needs = {row[0]: pending.pop(row[0]) for row in item.chunks if row[0] in pending}
        full = len(current[0]) >= FILES_PER_APPLY or (
            current[1] and len(current[1]) + len(needs) > VECTORS_PER_APPLY
        )
        if full:
            out.append(current)
            current = ([], {})
        current[0].append(item)
        current[1].update(needs)
    out.append(current)
    return out


# -- reuse: a fresh clone fetches the team's vectors before indexing -----------------------------


@dataclass
class ReuseReport:
    """What `prefetch_vectors` found: chunks in the workspace, vectors fetched from the server."""

    files: int = 0
    chunks: int = 0
    already_cached: int = 0
    fetched: int = 0
    seconds: float = 0.0
    bytes_received: int = 0


def prefetch_vectors(
    root: Path,
    settings: IndexSettings,
    embedder: Embedder,
    cache: EmbeddingCache,
    keys: SyncKeys,
    client: SyncClient,
) -> ReuseReport:
    """Chunk the workspace (no model needed), fetch the vectors the tenant already holds for
    those chunks, and put them in the embedding cache, where the indexer will find them.

    The client asks only for keys derived from content it holds; the server answers only for
    keys its tenant stored. Needs the same secret and embedding model as whoever uploaded them.
    """
    started = time.perf_counter()
    received = client.stats.bytes_received
    report = ReuseReport()
    scanner = Scanner(root, exclude=settings.exclude, follow_symlinks=settings.follow_symlinks)
    chunker = chunker_for(embedder, settings)
    chunk_ids: set[str] = set()
    for rel in scanner.scan(StatCache()).changed:
        content = read_file(root, rel, settings.max_file_bytes)
        if content.data is None:
            continue
        report.files += 1
        try:
            chunk_ids.update(c.id for c in chunker.chunk(rel, content.text))
        except Exception:  # the indexer skips such a file too
            log.warning("could not chunk %s", rel, exc_info=True)
    report.chunks = len(chunk_ids)
    cached = cache.get(embedder.model_id, sorted(chunk_ids), embedder.dimension)
    report.already_cached = len(cached)
    by_key = {keys.chunk(i): i for i in chunk_ids if i not in cached}
    model = keys.model(embedder.model_id)
    wanted = sorted(by_key)
    for start in range(0, len(wanted), KEYS_BATCH):
        held = sorted(client.known(model, wanted[start : start + KEYS_BATCH]))
        for offset in range(0, len(held), VECTORS_PER_APPLY):
            fetched = client.vectors(model, held[offset : offset + VECTORS_PER_APPLY])
            vectors = {
                by_key[k]: _unit(v)
                for k, v in fetched.items()
                if k in by_key and v.shape == (embedder.dimension,)
            }
            cache.put(embedder.model_id, vectors)
            report.fetched += len(vectors)
    report.bytes_received = client.stats.bytes_received - received
    report.seconds = time.perf_counter() - started
    return report


def _unit(vector: np.ndarray) -> np.ndarray:
    """Back to float32 unit length (float16 on the wire rounds the norm slightly)."""
    norm = float(np.linalg.norm(vector))
    return (vector / norm).astype(np.float32) if norm > 0 else vector.astype(np.float32)


# -- the background syncer -------------------------------------------------------------------


class IndexSyncer:
    """Keeps the server's copy of a workspace index current, without ever blocking search.

    `store` returns the index's store (None while it is not open yet). A sync runs when the local
    Merkle root (`local_root`) has changed and then stayed put for `debounce_s`, every
    `interval_s` regardless, and on `sync_now()`. Failures are logged and retried with jittered
    exponential backoff up to `backoff_max_s`.
    """

    def __init__(
        self,
        store: Callable[[], IndexStore | None],
        local_root: Callable[[], bytes | None],
        client: SyncClient,
        keys: SyncKeys,
        workspace: str,
        *,
        debounce_s: float = 5.0,
        interval_s: float = 600.0,
        poll_s: float = 1.0,
        backoff_initial_s: float = 2.0,
        backoff_max_s: float = 300.0,
        dtype: str = "float16",
    ) -> None:
        self._store = store
        self._local_root = local_root
        self.client = client
        self.keys = keys
        self.workspace = keys.workspace(workspace)
        self.debounce_s = debounce_s
        self.interval_s = interval_s
        self.poll_s = poll_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.dtype = dtype
        self._cond = threading.Condition()
        self._wanted = False
        self._closing = False
        self._generation = 0  # completed attempts, for sync_now's wait
        self._thread: threading.Thread | None = None
        self.last_report: SyncReport | None = None
        self.last_error = ""
        self.synced_root: bytes | None = None  # keyed root the server confirmed
        self.synced_local_root: bytes | None = None  # local (plain) root that sync covered
        self.failures = 0
        # What every successful sync since the start sent (`last` is only the latest, often one
        # that found the server in sync already).
        self.totals = {"syncs": 0, "files_uploaded": 0, "chunks_placed": 0, "vectors_uploaded": 0}

    def start(self) -> None:
        """Begin syncing in a daemon thread."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="tabloop-index-sync", daemon=True
                )
                self._thread.start()

    def sync_now(self, timeout: float | None = None) -> SyncReport | None:
        """Sync as soon as possible and wait (up to `timeout`) for that attempt's report;
        None when it failed or did not finish in time (see `last_error`)."""
        with self._cond:
            target = self._generation + 1
            self._wanted = True
            self._cond.notify_all()
            deadline = None if timeout is None else time.monotonic() + timeout
            while self._generation < target and not self._closing:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)
            return self.last_report if not self.last_error else None

    def close(self, timeout: float = 10.0) -> None:
        """Stop the thread (interrupting a backoff) and close the connection."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self.client.close()
        if self._thread is not None:
            self._thread.join(timeout)

    def status(self) -> dict[str, Any]:
        report = self.last_report
        return {
            "synced_root": self.synced_root.hex() if self.synced_root else "",
            "failures": self.failures,
            "error": self.last_error,
            "last": report.as_json() if report else None,
            "totals": dict(self.totals),
        }

    def _due(self, seen: bytes | None, seen_at: float, last_attempt: float) -> bool:
        now = time.monotonic()
        if self._wanted:
            return True
        if seen is not None and seen != self.synced_local_root and now - seen_at >= self.debounce_s:
            return True
        return self.interval_s > 0 and now - last_attempt >= self.interval_s

    def _run(self) -> None:
        seen: bytes | None = None
        seen_at = time.monotonic()
        last_attempt = time.monotonic()
        retry_at = 0.0
        failed = 0  # consecutive failed attempts
        # The shared backoff rule of everything that talks to the backend (`common.http`).
        backoff = Backoff(self.backoff_initial_s, self.backoff_max_s)
        while True:
            with self._cond:
                if self._closing:
                    return
                self._cond.wait(self.poll_s)
                if self._closing:
                    return
            root = self._local_root()
            if root != seen:
                seen, seen_at = root, time.monotonic()
            if time.monotonic() < retry_at and not self._wanted:
                continue
            if not self._due(seen, seen_at, last_attempt):
                continue
            with self._cond:
                self._wanted = False
            last_attempt = time.monotonic()
            ok = self._attempt()
            if ok:
                failed, retry_at = 0, 0.0
            else:
                retry_at = time.monotonic() + backoff.delay(failed)
                failed += 1

    def _attempt(self) -> bool:
        store = self._store()
        error = ""
        if store is None:
            error = "the index is not open yet"
        else:
            try:
                report = sync_index(store, self.keys, self.client, self.workspace, dtype=self.dtype)
                self.last_report = report
                self.synced_root = bytes.fromhex(report.root)
                # What the store held when the sync read it; a later change makes a sync due.
                self.synced_local_root = bytes.fromhex(report.local_root)
                self.totals["syncs"] += 1
                for name in ("files_uploaded", "chunks_placed", "vectors_uploaded"):
                    self.totals[name] += getattr(report, name)
                log.info(
                    "index synced: %d files, %d vectors, %d bytes",
                    report.files_uploaded,
                    report.vectors_uploaded,
                    report.bytes_sent + report.bytes_received,
                )
            except (SyncFailed, SyncRejected, IndexChanged) as exc:
                error = str(exc)
            except Exception as exc:  # never let the thread die: search must go on
                log.exception("index sync failed")
                error = f"{type(exc).__name__}: {exc}"
        with self._cond:
            self.last_error = error
            self.failures = self.failures + 1 if error else 0
            self._generation += 1
            self._cond.notify_all()
        if error:
            log.warning("index sync failed (will retry): %s", error)
        return not error


def workspace_name(root: Path) -> str:
    """The name a workspace is keyed by: its resolved root path (keyed before it leaves)."""
    return str(root.resolve())
