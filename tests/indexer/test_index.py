"""The index as the server uses it: search, updates, removal, caching, symbols, watching."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from indexer.embed import SentenceTransformerEmbedder
from indexer.embed_onnx import OnnxEmbedder
from indexer.merkle import MerkleTree
from indexer.scan import leaf_hash
from indexer.service import WorkspaceIndex
from tests.indexer.conftest import index_once, quiet_settings
from tests.support.embedders import HashingEmbedder

OpenIndex = Callable[..., WorkspaceIndex]

NEW_FUNCTION = '''

def frobnicate_widgets(widgets, factor):
    """Scale every widget's frobnication level by a factor."""
    return [widget.frobnicate(factor) for widget in widgets]
'''


def top_paths(index: WorkspaceIndex, query: str, k: int = 3) -> list[str]:
    return [hit.path for hit in index.search(query, k)]


def test_search_finds_the_defining_file(workspace: Path, open_index: OpenIndex) -> None:
    index = open_index(workspace)
    status = index.status()
    assert status["state"] == "ready" and status["files"] == 8 and status["chunks"] > 30
    hits = index.search("insort right: insert item x in list a, and keep it sorted", 3)
    assert hits[0].path == "bisect.py"
    assert "insort_right" in hits[0].symbols
    hit = hits[0]
    assert hit.preview and hit.text.startswith(hit.preview)
    assert 0 < hit.score <= 1.0001
    assert index.search("rgb to hls colorsys", 1)[0].path == "colorsys.py"
    assert top_paths(index, "decoder scanstring", 5)[0].startswith("json/")


def test_restart_embeds_nothing(
    workspace: Path, cache_dir: Path, embedder: HashingEmbedder
) -> None:
    _, first = index_once(workspace, cache_dir, embedder)
    assert first is not None and first.chunks_embedded > 0
    embedded = embedder.texts_embedded
    with WorkspaceIndex(workspace, quiet_settings(), cache_dir, embedder=embedder) as index:
        index.start()
        assert index.wait_idle(60)
        again = index.last_stats
        assert again is not None
        assert (again.files_changed, again.chunks_embedded) == (0, 0)
        assert again.chunks_total == first.chunks_total
        assert embedder.texts_embedded == embedded
        assert index.search("bisect insort", 1)[0].path == "bisect.py"


def test_identical_text_is_embedded_once(workspace: Path, open_index: OpenIndex) -> None:
    shutil.copy(workspace / "bisect.py", workspace / "bisect_copy.py")
    index = open_index(workspace)
    embedder = index._embedder
    assert isinstance(embedder, HashingEmbedder)
    total = index.status()["chunks"]
    assert embedder.texts_embedded < total  # the copy reused every vector of the original
    paths = {hit.path for hit in index.search("insort right bisect", 6)}
    assert {"bisect.py", "bisect_copy.py"} <= paths


def test_cache_is_shared_across_workspaces(
    workspace: Path, tmp_path: Path, cache_dir: Path, embedder: HashingEmbedder
) -> None:
    clone = tmp_path / "clone"
    shutil.copytree(workspace, clone)
    index_once(workspace, cache_dir, embedder)
    _, stats = index_once(clone, cache_dir, embedder)
    assert stats is not None
    assert stats.chunks_embedded == 0 and stats.chunks_reused == stats.chunks_total


@pytest.mark.parametrize(
    ("engine", "runner"),
    [("torch", SentenceTransformerEmbedder), ("onnxruntime", OnnxEmbedder)],
)
def test_real_embedder_path_and_cache(
    workspace: Path,
    cache_dir: Path,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    engine: str,
    runner: type[SentenceTransformerEmbedder | OnnxEmbedder],
) -> None:
    calls: list[int] = []
    original = runner.embed

    def counting(self: SentenceTransformerEmbedder | OnnxEmbedder, texts: list[str]) -> object:
        calls.append(len(texts))
        return original(self, texts)  # type: ignore[arg-type]

    monkeypatch.setattr(runner, "embed", counting)
    settings = quiet_settings(embedding_model=str(tiny_model_dir), embedding_engine=engine)
    for run in range(2):
        with WorkspaceIndex(workspace, settings, cache_dir) as index:
            index.start()
            assert index.wait_idle(600), index.status()
            assert index.status()["embeddingEngine"] == (
                "sentence-transformers" if engine == "torch" else engine
            )
            stats = index.last_stats
            assert stats is not None and stats.chunks_total > 30
            if run == 0:
                assert sum(calls) == stats.chunks_embedded > 0
                first_calls = len(calls)
            else:
                assert len(calls) == first_calls  # nothing embedded on the second run
                assert len(index.search("bisect", 3)) == 3
                assert len(calls) == first_calls + 1  # the query


def test_unsaved_buffer_is_searchable_then_reverts(workspace: Path, open_index: OpenIndex) -> None:
    index = open_index(workspace)
    path = workspace / "fnmatch.py"
    disk = path.read_text()
    index.update_document(path, disk + NEW_FUNCTION)
    assert index.wait_idle(30)
    hit = index.search("frobnicate widgets factor", 1)[0]
    assert hit.path == "fnmatch.py" and "frobnicate_widgets" in hit.symbols
    line = (disk + NEW_FUNCTION).splitlines().index("def frobnicate_widgets(widgets, factor):")
    chunk = index.chunk_at(path, line)
    assert chunk is not None and "frobnicate_widgets" in chunk.text
    assert [s.name for s in index.symbols("frobnicate", 5)][:1] == ["frobnicate_widgets"]
    index.update_document(path, None)  # closed without saving: back to the disk's content
    assert index.wait_idle(30)
    assert all("frobnicate" not in h.text for h in index.search("frobnicate widgets", 5))


def test_remove_and_merkle_follow_the_files(workspace: Path, open_index: OpenIndex) -> None:
    index = open_index(workspace)
    (workspace / "colorsys.py").unlink()
    index.remove(workspace / "colorsys.py")
    (workspace / "bisect.py").write_text("def only():\n    return 1\n")
    index.update_document(workspace / "bisect.py", None)
    assert index.wait_idle(30)
    assert "colorsys.py" not in top_paths(index, "rgb to hls colorsys", 10)
    assert index.status()["files"] == 7
    indexer = index.indexer
    assert indexer is not None
    on_disk = {
        p.relative_to(workspace).as_posix(): leaf_hash(p.read_bytes())
        for p in workspace.rglob("*")
        if p.is_file()
    }
    assert indexer.tree.root_hash == MerkleTree.from_leaves(on_disk).root_hash
    assert index.status()["merkleRoot"] == indexer.tree.root_hash.hex()


def test_chunk_at_and_paths_outside(workspace: Path, open_index: OpenIndex, tmp_path: Path) -> None:
    index = open_index(workspace)
    chunk = index.chunk_at("bisect.py", 0)
    assert chunk is not None and chunk.start_line == 0 and chunk.path == "bisect.py"
    assert index.chunk_at("bisect.py", 10_000) is None
    assert index.chunk_at(tmp_path / "elsewhere.py", 0) is None
    index.update_document(tmp_path / "elsewhere.py", "x = 1\n")  # ignored, not an error
    index.update_document(workspace / ".env", "SECRET=1\n")  # denied, never indexed
    assert index.wait_idle(30)
    assert index.chunk_at(".env", 0) is None


def test_symbols_by_name_then_by_meaning(workspace: Path, open_index: OpenIndex) -> None:
    index = open_index(workspace)
    names = [s.name for s in index.symbols("insort", 10)]
    assert names[0] in ("insort", "insort_left", "insort_right")
    assert {"insort_left", "insort_right"} <= set(names)
    methods = index.symbols("JSONDecoder", 5)
    assert methods[0].name == "JSONDecoder" and methods[0].kind == "class"
    decode = next(s for s in index.symbols("raw_decode", 5) if s.name == "raw_decode")
    assert decode.container == "JSONDecoder" and decode.kind == "method"
    # A name lookup alone (what retrieval asks for definitions): only names holding the query.
    by_name = index.symbols("decode", 50, by_meaning=False)
    assert by_name and all("decode" in s.name.lower() for s in by_name)
    assert index.symbols("JSONDecoder", 5, by_meaning=False)[0].name == "JSONDecoder"


def test_watcher_indexes_a_new_file(workspace: Path, open_index: OpenIndex) -> None:
    index = open_index(workspace, watch=True, debounce_ms=50)
    (workspace / "widgets.py").write_text(NEW_FUNCTION)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        hits = index.search("frobnicate widgets", 1)
        if hits and hits[0].path == "widgets.py":
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the new file was not indexed: {index.status()}")


def test_hnsw_past_the_threshold(workspace: Path, open_index: OpenIndex, cache_dir: Path) -> None:
    index = open_index(workspace, hnsw_threshold=20)
    store = index.store
    assert store is not None and store.vectors.is_hnsw
    assert index.search("bisect insort right", 1)[0].path == "bisect.py"
    index.remove(workspace / "bisect.py")
    assert index.wait_idle(30)
    assert "bisect.py" not in top_paths(index, "bisect insort right", 5)
    index.close()
    reopened = WorkspaceIndex(
        workspace, quiet_settings(hnsw_threshold=20), cache_dir, embedder=HashingEmbedder()
    )
    reopened.start()
    assert reopened.wait_idle(30)
    assert reopened.store is not None and reopened.store.recovered == []
    assert reopened.search("rgb to hls colorsys", 1)[0].path == "colorsys.py"
    reopened.close()


def test_a_query_is_embedded_on_one_thread_and_a_batch_on_all(tiny_model_dir: Path) -> None:
    # Several torch threads that wait on each other stall when another process holds a core
    # (the completion model, on the same two cores): a query, a few texts, runs on one thread.
    import torch

    embedder = SentenceTransformerEmbedder(str(tiny_model_dir))
    model = embedder._load()
    seen: list[int] = []
    encode = model.encode

    def recording(*args: object, **kwargs: object) -> object:
        seen.append(torch.get_num_threads())
        return encode(*args, **kwargs)

    model.encode = recording
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        query = embedder.embed(["def frobnicate(widgets):"])
        batch = embedder.embed([f"def function_{n}(): return {n}" for n in range(10)])
        assert seen == [1, 2]
        assert torch.get_num_threads() == 2
        assert query.shape == (1, embedder.dimension) and batch.shape[0] == 10
    finally:
        torch.set_num_threads(before)
