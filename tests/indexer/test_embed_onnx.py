"""The index's ONNX Runtime embedder: sentence-transformers' vectors, exported once, no torch."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from common.manifest import MANIFEST
from indexer import embed_onnx
from indexer.embed import SentenceTransformerEmbedder
from indexer.embed_onnx import (
    ExportError,
    OnnxEmbedder,
    export_path,
    load_embedder,
    pooling_mode,
    runs_in_onnx,
)

REPO = Path(__file__).resolve().parents[2]
TEXTS = [
    "def rectangle_area(width, height):\n    return width * height\n",
    "x",
    "class Config:\n    '''Settings read from the environment.'''\n" * 20,  # past the limit
    "import os\nimport sys\n",
    "",
    "for line in open(path):\n    print(line.rstrip())\n",
]


@pytest.fixture
def onnx_embedder(tiny_embedder_path: Path, tmp_path: Path) -> OnnxEmbedder:
    embedder = load_embedder(str(tiny_embedder_path), cache_dir=tmp_path / "cache")
    assert isinstance(embedder, OnnxEmbedder)
    return embedder


def count_exports(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The working directories of every export from now on (each still made)."""
    exports: list[Path] = []
    real_export = embed_onnx._export_in_child

    def counted(source: Path, work: Path, pooling: str) -> None:
        exports.append(work)
        real_export(source, work, pooling)

    monkeypatch.setattr(embed_onnx, "_export_in_child", counted)
    return exports


def test_it_gives_sentence_transformers_vectors(
    onnx_embedder: OnnxEmbedder, tiny_embedder_path: Path
) -> None:
    reference = SentenceTransformerEmbedder(str(tiny_embedder_path))
    vectors = onnx_embedder.embed(TEXTS)
    assert onnx_embedder.engine == "onnxruntime" and onnx_embedder.failure is None
    assert vectors.shape == (len(TEXTS), reference.dimension) and vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, reference.embed(TEXTS), atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    # The same model, the same vectors: cached under the same id, with the same token limit.
    assert onnx_embedder.model_id == reference.model_id
    assert onnx_embedder.max_tokens == reference.max_tokens


def test_a_text_gets_the_same_vector_alone_or_padded_in_a_batch(
    onnx_embedder: OnnxEmbedder,
) -> None:
    batched = onnx_embedder.embed(TEXTS)
    alone = np.stack([onnx_embedder.embed([text])[0] for text in TEXTS])
    np.testing.assert_allclose(batched, alone, atol=1e-6)
    assert onnx_embedder.embed([]).shape == (0, onnx_embedder.dimension)


def test_the_export_is_made_once_and_checked_before_each_load(
    onnx_embedder: OnnxEmbedder,
    tiny_embedder_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = onnx_embedder.embed(TEXTS[:2])
    exports = count_exports(monkeypatch)
    again = load_embedder(str(tiny_embedder_path), cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(again.embed(TEXTS[:2]), first)
    assert exports == []  # loaded as it was

    folder = export_path(
        tiny_embedder_path, onnx_embedder.fallback.fingerprint, "mean", tmp_path / "cache"
    )
    graph = folder / "model.onnx"
    graph.write_bytes(graph.read_bytes()[:-100])  # damaged: a truncated file
    caplog.set_level(logging.WARNING)
    third = load_embedder(str(tiny_embedder_path), cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(third.embed(TEXTS[:2]), first)
    assert len(exports) == 1 and "damaged" in caplog.text


def test_the_tensors_live_beside_the_graph_and_an_older_copy_is_exported_again(
    onnx_embedder: OnnxEmbedder,
    tiny_embedder_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine maps a graph's external tensors (only the embedding rows read stay resident)
    but reads a graph's own into its heap: a copy made with them inside (layout 1) is redone."""
    first = onnx_embedder.embed(TEXTS)
    folder = export_path(
        tiny_embedder_path, onnx_embedder.fallback.fingerprint, "mean", tmp_path / "cache"
    )
    weights, graph = folder / embed_onnx.WEIGHTS, folder / embed_onnx.GRAPH
    assert weights.stat().st_size > 10 * graph.stat().st_size
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["layout"] == embed_onnx.LAYOUT == 2
    del manifest["layout"]  # as a copy of layout 1 reads
    (folder / MANIFEST).write_text(json.dumps(manifest))

    exports = count_exports(monkeypatch)
    again = load_embedder(str(tiny_embedder_path), cache_dir=tmp_path / "cache")
    np.testing.assert_array_equal(again.embed(TEXTS), first)
    assert len(exports) == 1
    assert json.loads((folder / MANIFEST).read_text())["layout"] == 2


def test_a_failed_export_falls_back_to_sentence_transformers(
    tiny_embedder_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(source: Path, work: Path, pooling: str) -> None:
        raise ExportError("the ONNX export failed (exit status 1): no exporter here")

    monkeypatch.setattr(embed_onnx, "_export_in_child", broken)
    caplog.set_level(logging.WARNING, logger="indexer.embed_onnx")
    embedder = load_embedder(str(tiny_embedder_path), cache_dir=tmp_path / "cache")
    vectors = embedder.embed(TEXTS)
    reference = SentenceTransformerEmbedder(str(tiny_embedder_path)).embed(TEXTS)
    np.testing.assert_array_equal(vectors, reference)
    assert isinstance(embedder, OnnxEmbedder)
    assert embedder.engine == "sentence-transformers"
    assert "no exporter here" in (embedder.failure or "") and "no exporter here" in caplog.text
    # Nothing half-made is left where the next load would look.
    cache = tmp_path / "cache" / "models" / "embeddings"
    assert not [p for p in cache.iterdir() if p.is_dir()]


def test_what_runs_in_onnx(tiny_embedder_path: Path, tmp_path: Path) -> None:
    assert runs_in_onnx("bundled", "onnxruntime")
    assert runs_in_onnx(str(tiny_embedder_path), "onnxruntime")
    assert not runs_in_onnx(str(tiny_embedder_path), "torch")
    assert not runs_in_onnx("sentence-transformers/all-MiniLM-L6-v2", "onnxruntime")
    assert pooling_mode(tiny_embedder_path) == "mean"
    # A model that pools otherwise (here: weighted mean) stays in sentence-transformers.
    weighted = tmp_path / "weighted"
    shutil.copytree(tiny_embedder_path, weighted)
    config = weighted / "1_Pooling" / "config.json"
    settings = json.loads(config.read_text(encoding="utf-8"))
    config.write_text(json.dumps({**settings, "pooling_mode": "weightedmean"}), encoding="utf-8")
    assert pooling_mode(weighted) is None and not runs_in_onnx(str(weighted), "onnxruntime")
    embedder = load_embedder(str(weighted), cache_dir=tmp_path / "cache")
    assert isinstance(embedder, SentenceTransformerEmbedder)
    torch_one = load_embedder(str(tiny_embedder_path), cache_dir=tmp_path, engine="torch")
    assert isinstance(torch_one, SentenceTransformerEmbedder)


def test_indexing_with_it_imports_neither_torch_nor_sentence_transformers(
    tiny_embedder_path: Path, tmp_path: Path
) -> None:
    """What the language server holds: an index built and searched in a process that never
    imports torch (the export runs in a child)."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "shapes.py").write_text(TEXTS[0] * 5, encoding="utf-8")
    script = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from indexer.service import WorkspaceIndex
        from indexer.settings import IndexSettings

        settings = IndexSettings(embedding_model={str(tiny_embedder_path)!r}, debounce_ms=0)
        index = WorkspaceIndex(Path({str(workspace)!r}), settings, Path({str(tmp_path)!r}))
        index.start()
        assert index.wait_idle(120), index.status()
        assert index.status()["chunks"] > 0, index.status()
        assert index.status()["embeddingEngine"] == "onnxruntime", index.status()
        assert index.search("area of a rectangle", 1)
        index.close()
        heavy = ("torch", "sentence_transformers", "transformers")
        print("held:", sorted(m for m in heavy if m in sys.modules))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "held: []" in done.stdout
