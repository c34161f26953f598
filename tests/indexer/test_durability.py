"""Durability: kill -9 mid-write, corrupt files, stale temporaries, two processes at once."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from indexer.atomic_files import atomic_write
from indexer.chunking import Chunker, EstimatedCounter
from indexer.embed import EmbeddingCache
from indexer.scan import read_file
from indexer.service import WorkspaceIndex
from indexer.store import FileUpdate, IndexStore, index_dir
from tests.indexer.conftest import index_once, quiet_settings
from tests.support.embedders import HashingEmbedder

KILLS = 12


def open_store(directory: Path, embedder: HashingEmbedder) -> IndexStore:
    return IndexStore(directory, dimension=embedder.dimension, model_id=embedder.model_id)


def updates_for(root: Path, texts: dict[str, str], embedder: HashingEmbedder) -> list[FileUpdate]:
    chunker = Chunker(EstimatedCounter())
    out = []
    for rel, text in texts.items():
        (root / rel).write_text(text)
        content = read_file(root, rel, 1_000_000)
        chunks = chunker.chunk(rel, text)
        vectors = dict(
            zip([c.id for c in chunks], embedder.embed([c.text for c in chunks]), strict=True)
        )
        out.append(FileUpdate(rel, content.stat, chunks, vectors))
    return out


def state_of(store: IndexStore) -> frozenset[tuple[str, str]]:
    rows = store.db.execute("SELECT path, chunk FROM chunks").fetchall()
    return frozenset((path, chunk) for path, chunk in rows)


def assert_consistent(store: IndexStore) -> None:
    """Every chunk row has its vector in FAISS, and each is found by its own vector."""
    rows = store.db.execute(
        "SELECT chunks.id, contents.vector FROM chunks JOIN contents USING (chunk)"
    ).fetchall()
    assert store.vectors.live == len(rows)
    for row, blob in rows[:: max(1, len(rows) // 10)]:
        best = store.vectors.search(np.frombuffer(blob, np.float32), 50)
        assert row in [i for i, s in best if s > 0.999]


def test_kill_during_save_leaves_old_or_new_state(
    workspace: Path, cache_dir: Path, embedder: HashingEmbedder
) -> None:
    index_once(workspace, cache_dir, embedder)
    directory = index_dir(cache_dir, workspace.resolve())
    names = ["bisect.py", "colorsys.py", "fnmatch.py"]
    old_texts = {n: (workspace / n).read_text() for n in names}
    new_texts = {
        n: t.replace("def ", "def renamed_") + "\nextra = 1\n" for n, t in old_texts.items()
    }
    old_updates = updates_for(workspace, old_texts, embedder)
    new_updates = updates_for(workspace, new_texts, embedder)
    store = open_store(directory, embedder)
    store.apply(old_updates, [])
    store.save()
    old_state = state_of(store)
    store.apply(new_updates, [])
    new_state = state_of(store)
    store.apply(old_updates, [])
    store.save()
    store.close()
    assert old_state != new_state
    rng = random.Random(7)
    seen: set[frozenset[tuple[str, str]]] = set()
    for _ in range(KILLS):
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the writer: flip between the two states, saving each time
            try:
                os.close(ready_r)
                child = open_store(directory, embedder)
                os.write(ready_w, b"1")
                while True:
                    child.apply(new_updates, [])
                    child.save()
                    child.apply(old_updates, [])
                    child.save()
            finally:
                os._exit(1)
        os.close(ready_w)
        assert os.read(ready_r, 1) == b"1"
        os.close(ready_r)
        time.sleep(rng.uniform(0.0, 0.25))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        reopened = open_store(directory, embedder)
        try:
            assert not [r for r in reopened.recovered if r.startswith("database")]
            state = state_of(reopened)
            assert state in (old_state, new_state)
            seen.add(state)
            assert_consistent(reopened)
        finally:
            reopened.close()
    assert seen  # (both states usually appear; which one is a matter of timing)


def test_corrupt_vector_snapshot_is_moved_aside_and_rebuilt(
    workspace: Path, cache_dir: Path, embedder: HashingEmbedder
) -> None:
    chunks = index_once(workspace, cache_dir, embedder)[0]["chunks"]
    directory = index_dir(cache_dir, workspace.resolve())
    (snapshot,) = directory.glob("vectors-*.faiss")
    data = bytearray(snapshot.read_bytes())
    data[len(data) // 2] ^= 0xFF
    snapshot.write_bytes(bytes(data))
    with WorkspaceIndex(workspace, quiet_settings(), cache_dir, embedder=embedder) as index:
        index.start()
        assert index.wait_idle(60)
        assert any("checksum" in r for r in index.status()["recovered"])
        assert list(directory.glob("*.faiss.corrupt"))
        assert index.status()["chunks"] == chunks
        assert index.search("insort right: insert item x in list a", 1)[0].path == "bisect.py"
        assert index.store is not None
        assert_consistent(index.store)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda b: b"garbage" * 100 + b[700:], id="header"),
        pytest.param(lambda b: b[: len(b) // 3], id="truncated"),
    ],
)
def test_corrupt_database_is_moved_aside_and_rebuilt(
    workspace: Path, cache_dir: Path, embedder: HashingEmbedder, damage: object
) -> None:
    chunks = index_once(workspace, cache_dir, embedder)[0]["chunks"]
    directory = index_dir(cache_dir, workspace.resolve())
    database = directory / "meta.sqlite3"
    database.write_bytes(damage(database.read_bytes()))  # type: ignore[operator]
    embedded = embedder.texts_embedded
    with WorkspaceIndex(workspace, quiet_settings(), cache_dir, embedder=embedder) as index:
        index.start()
        assert index.wait_idle(60)
        status = index.status()
        assert any(r.startswith("database") for r in status["recovered"]), status
        assert (directory / "meta.sqlite3.corrupt").exists()
        assert status["chunks"] == chunks
        assert embedder.texts_embedded == embedded  # rebuilt from the embedding cache
        assert index.search("insort right: insert item x in list a", 1)[0].path == "bisect.py"


def test_corrupt_embedding_cache_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / "embeddings.sqlite3"
    cache = EmbeddingCache(path)
    cache.put("m", {"a": np.ones(4, np.float32)})
    cache.close()
    path.write_bytes(b"not a database" * 1000)
    cache = EmbeddingCache(path)
    assert cache.get("m", ["a"], 4) == {}
    cache.put("m", {"b": np.ones(4, np.float32)})
    assert list(cache.get("m", ["b"], 4)) == ["b"]
    assert (tmp_path / "embeddings.sqlite3.corrupt").exists()


def test_stale_temporaries_are_removed(
    workspace: Path, cache_dir: Path, embedder: HashingEmbedder
) -> None:
    directory = index_dir(cache_dir, workspace.resolve())
    directory.mkdir(parents=True)
    (directory / "vectors-9.faiss.1234.tmp").write_bytes(b"half a file")
    index_once(workspace, cache_dir, embedder)
    assert not list(directory.glob("*.tmp"))


def test_atomic_write_keeps_old_content_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "f"
    atomic_write(target, b"old")

    with pytest.raises(TypeError):
        atomic_write(target, object())  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert not list(tmp_path.glob("*.tmp"))


def test_second_index_in_a_process_is_read_only(
    workspace: Path, cache_dir: Path, embedder: HashingEmbedder
) -> None:
    with WorkspaceIndex(workspace, quiet_settings(), cache_dir, embedder=embedder) as writer:
        writer.start()
        assert writer.wait_idle(60)
        reader = WorkspaceIndex(workspace, quiet_settings(), cache_dir, embedder=embedder)
        reader.start()
        assert reader.wait_idle(60)
        assert reader.status()["state"] == "readonly" and not reader.status()["writer"]
        assert reader.search("rgb to hls colorsys", 1)[0].path == "colorsys.py"
        reader.update_document(workspace / "bisect.py", "x = 1\n")  # ignored by a reader
        reader.close()
        assert writer.status()["writer"]


def test_two_processes_indexing_one_workspace(
    workspace: Path, cache_dir: Path, embedder: HashingEmbedder
) -> None:
    for i in range(30):
        (workspace / f"gen_{i}.py").write_text(f"def generated_{i}(x):\n    return x * {i}\n")
    pids = []
    for worker in range(2):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                settings = quiet_settings(lock_timeout_s=60.0)
                with WorkspaceIndex(workspace, settings, cache_dir, embedder=embedder) as index:
                    index.start()
                    index.wait_idle(60)
                    (workspace / f"gen_{worker}.py").write_text(
                        f"def worker_{worker}():\n    pass\n"
                    )
                    index.update_document(workspace / f"gen_{worker}.py", None)
                    index.wait_idle(60)
                    code = 0 if index.status()["state"] == "ready" else 2
            finally:
                os._exit(code)
        pids.append(pid)
    assert [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids] == [0, 0]
    directory = index_dir(cache_dir, workspace.resolve())
    assert sqlite3.connect(directory / "meta.sqlite3").execute(
        "PRAGMA integrity_check"
    ).fetchone() == ("ok",)
    with WorkspaceIndex(workspace, quiet_settings(), cache_dir, embedder=embedder) as index:
        index.start()
        assert index.wait_idle(60)
        status = index.status()
        assert status["recovered"] == [] and status["files"] == 38
        assert index.last_stats is not None and index.last_stats.files_changed == 0
        assert index.store is not None
        assert_consistent(index.store)
        assert [s.name for s in index.symbols("worker_1", 1)] == ["worker_1"]
