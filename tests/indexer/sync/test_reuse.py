"""Cost of a one-file change, and reuse of a teammate's vectors by a fresh clone."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from indexer.embed import EmbeddingCache
from indexer.service import WorkspaceIndex
from indexer.sync import prefetch_vectors, sync_index
from indexer.sync_keys import SyncKeys
from tests.indexer.conftest import PLUMBING_MODULES, copy_stdlib, quiet_settings
from tests.indexer.sync.conftest import SECRET, assert_opaque, client_for
from tests.support.backend_server import BackendServer
from tests.support.embedders import HashingEmbedder

FAST_TMP = Path("/dev/shm") if os.path.isdir("/dev/shm") else None


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    """A scratch directory on tmpfs when there is one (the index fsyncs every batch)."""
    if FAST_TMP is None:
        yield tmp_path
        return
    path = FAST_TMP / f"tabloop-sync-{os.getpid()}-{tmp_path.name}"
    path.mkdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _open(root: Path, cache: Path, embedder: HashingEmbedder) -> WorkspaceIndex:
    index = WorkspaceIndex(root, quiet_settings(), cache, embedder=embedder)
    index.start()
    assert index.wait_idle(300), index.status()
    return index


def _generated_tree(root: Path, top: int = 20, sub: int = 10, files: int = 10) -> int:
    for i in range(top):
        for j in range(sub):
            directory = root / f"pkg{i}" / f"mod{j}"
            directory.mkdir(parents=True)
            for k in range(files):
                (directory / f"f{k}.py").write_text(
                    f"def handler_{i}_{j}_{k}(request):\n    return {i * j + k}\n"
                )
    return top * sub * files


def test_one_file_change_in_thousands_sends_little(
    sqlite_backend: BackendServer, fast_dir: Path
) -> None:
    root = fast_dir / "ws"
    count = _generated_tree(root)
    embedder = HashingEmbedder()
    keys = SyncKeys(SECRET)
    client = client_for(sqlite_backend)
    workspace = keys.workspace(str(root))
    index = _open(root, fast_dir / "cache", embedder)
    try:
        assert index.store is not None
        first = sync_index(index.store, keys, client, workspace)
        assert first.files_uploaded == count == 2000
        assert first.vectors_uploaded == index.store.counts()[1]

        target = root / "pkg7" / "mod3" / "f5.py"
        target.write_text(
            target.read_text() + "\n\ndef added_later(items):\n    return sorted(items)\n"
        )
        before = embedder.texts_embedded
        old_ids = {c.id for c in index.store.chunks_of("pkg7/mod3/f5.py")}
        index.update_document(target, None)
        assert index.wait_idle(60)
        new_ids = {c.id for c in index.store.chunks_of("pkg7/mod3/f5.py")}
        fresh = new_ids - old_ids
        assert fresh and embedder.texts_embedded - before == len(fresh)

        report = sync_index(index.store, keys, client, workspace)
        assert report.files_uploaded == 1 and report.paths_removed == 0
        assert report.vectors_uploaded == len(fresh)
        assert report.chunks_placed == len(new_ids)
        assert report.levels_walked == 3  # root, pkg7, pkg7/mod3
        # The children of the three directories on the path: 20 + 10 + 10 of 2,000 files.
        assert report.node_hashes_received == 40
        assert report.bytes_sent + report.bytes_received < 10_000
        assert report.requests == 6  # root, three levels, known, apply
    finally:
        index.close()
        client.close()


def _sync_workspace(backend: BackendServer, root: Path, cache: Path, secret: str) -> int:
    """Index and sync `root` as one teammate; the number of chunks it embedded."""
    embedder = HashingEmbedder()
    keys = SyncKeys(secret)
    client = client_for(backend)
    index = _open(root, cache, embedder)
    try:
        assert index.store is not None
        sync_index(index.store, keys, client, keys.workspace(str(root)))
    finally:
        index.close()
        client.close()
    return embedder.texts_embedded


@pytest.mark.parametrize(
    ("secret", "model", "reused"),
    [
        pytest.param(SECRET, "test:hashing", True, id="same-secret-and-model"),
        pytest.param("another", "test:hashing", False, id="other-secret"),
        pytest.param(SECRET, "test:other-model", False, id="other-model"),
    ],
)
def test_a_fresh_clone_reuses_the_teams_vectors(
    sqlite_backend: BackendServer, fast_dir: Path, secret: str, model: str, reused: bool
) -> None:
    first = copy_stdlib(fast_dir / "alice", PLUMBING_MODULES)
    embedded_by_alice = _sync_workspace(sqlite_backend, first, fast_dir / "alice-cache", SECRET)
    assert embedded_by_alice > 20

    clone = fast_dir / "bob"
    shutil.copytree(first, clone)
    embedder = HashingEmbedder(model_id=model)  # Bob's: counts what reaches the model
    cache_dir = fast_dir / "bob-cache"
    cache = EmbeddingCache(cache_dir / "embeddings.sqlite3")
    client = client_for(sqlite_backend)
    try:
        found = prefetch_vectors(clone, quiet_settings(), embedder, cache, SyncKeys(secret), client)
    finally:
        cache.close()
        client.close()
    # Neither teammate's requests carried a name or a line of the workspace.
    names = {p.stem for p in first.rglob("*") if len(p.stem) >= 5}
    lines = {
        line.strip()
        for p in first.rglob("*.py")
        for line in p.read_text().splitlines()
        if len(line.strip()) >= 20
    }
    for body in sqlite_backend.bodies:
        text = body.decode()
        assert_opaque(json.loads(text))
        assert not any(name in text for name in names)
        assert not any(line in text for line in lines)
    assert found.chunks == embedded_by_alice
    assert found.fetched == (found.chunks if reused else 0)
    assert embedder.texts_embedded == 0  # prefetching never needs the model

    index = _open(clone, cache_dir, embedder)
    try:
        assert embedder.texts_embedded == (0 if reused else embedded_by_alice)
        hits = index.search("decode a JSON document", k=3)
        assert hits and hits[0].path.startswith("json/")
    finally:
        index.close()
