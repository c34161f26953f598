"""The index's embedder in ONNX Runtime: sentence-transformers' vectors without torch in the server.

`import sentence_transformers` alone makes a process about 500 MB larger (torch, transformers and
what they import; docs/indexer.md), and the language server already holds ONNX Runtime for its
completion engine. So a local model of the plain shape (a Transformer, one pooling mode, unit
length: all-MiniLM-L6-v2, the bundled one) is exported once to ONNX, its pooling and normalisation
inside the graph, and run here with the model's own `tokenizer.json`.

The export runs torch's exporter in a child process (`python -m indexer.embed_onnx SOURCE OUT
POOLING`), so the server never imports torch for it. Its tensors go in a file beside the graph,
which ONNX Runtime maps: of the 47 MB word-embedding table only the rows of tokens read become
resident (docs/indexer.md). The copy is written as the engine's converted models are: into a
temporary directory, with a manifest of each file's size and SHA-256 (`common.manifest`), renamed
into place under a lock, and checked before every load. The vectors agree with
sentence-transformers' to within 1e-6 (`tests/indexer/test_embed_onnx.py` holds them to it), so
they are cached under the same model id: an index, or a team's vectors, made by either serves the
other. When the export fails the embedder says why once and runs the model in
sentence-transformers instead.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from common.child import ChildFailed, run_child
from common.locks import file_lock
from common.manifest import reuse_or_clear, write_manifest
from common.memory import release_mapped_file, trim_heap
from indexer.embed import (
    BUNDLED,
    QUERY_TEXTS,
    Embedder,
    SentenceTransformerEmbedder,
    bundled_model_path,
    describe_local_model,
    pooling_config,
)

log = logging.getLogger(__name__)

POOLING_MODES = ("mean", "cls", "max")
GRAPH = "model.onnx"
WEIGHTS = "model.onnx.data"  # the tensors, beside the graph (layout 2)
# Layout 2: the tensors in `WEIGHTS`, which ONNX Runtime maps rather than reads into its heap, so
# the word-embedding table (30,522 rows, 47 MB in float32) is resident only where a token was
# read; layout 1 held them in the graph's file. A copy of layout 1 is exported again.
LAYOUT = 2
OPSET = 17
EXPORT_TIMEOUT_S = 900


class ExportError(RuntimeError):
    """The model could not be exported to ONNX."""


def pooling_mode(path: Path) -> str | None:
    """The one pooling mode (`mean`, `cls` or `max`) of the sentence-transformers model in
    `path`, or None when it pools otherwise (several modes, weighted, a Dense layer after)."""
    config = pooling_config(path)
    if config is None:
        return None
    if isinstance(config.get("pooling_mode"), str):  # sentence-transformers 6
        mode = config["pooling_mode"]
    else:
        flags = [key for key, on in config.items() if key.startswith("pooling_mode_") and on]
        names = {
            "pooling_mode_mean_tokens": "mean",
            "pooling_mode_cls_token": "cls",
            "pooling_mode_max_tokens": "max",
        }
        mode = names.get(flags[0], "") if len(flags) == 1 else ""
    return mode if mode in POOLING_MODES else None


def export_path(source: Path, fingerprint: str, pooling: str, cache_dir: Path) -> Path:
    """Where the ONNX copy of the model in `source` lives."""
    return cache_dir / "models" / "embeddings" / f"{source.name}-{fingerprint}-{pooling}"


def ensure_exported(source: Path, fingerprint: str, pooling: str, cache_dir: Path) -> Path:
    """The directory of the verified ONNX copy of `source`, exporting it first when needed.

    Raises `ExportError` (with the end of the exporter's output) when the export fails.
    """
    target = export_path(source, fingerprint, pooling, cache_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.with_name(target.name + ".lock")):
        if reuse_or_clear(target, "the ONNX embedder", LAYOUT):
            return target
        log.info("exporting the embedding model %s to ONNX (once)", source.name)
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            _export_in_child(source, work, pooling)
            import onnxruntime

            write_manifest(
                work,
                {
                    "source": str(source),
                    "fingerprint": fingerprint,
                    "pooling": pooling,
                    "opset": OPSET,
                    "onnxruntime": onnxruntime.__version__,
                    "weights": GRAPH,
                    "layout": LAYOUT,
                },
            )
            work.chmod(0o755)
            work.rename(target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return target


def _export_in_child(source: Path, work: Path, pooling: str) -> None:
    command = [sys.executable, "-m", "indexer.embed_onnx", str(source), str(work), pooling]
    try:
        run_child(command, timeout_s=EXPORT_TIMEOUT_S, what="the ONNX export")
    except ChildFailed as exc:
        raise ExportError(str(exc)) from exc
    if not (work / GRAPH).is_file():
        raise ExportError(f"the ONNX export wrote no {GRAPH}")


def export(source: Path, out: Path, pooling: str) -> None:
    """Write the model in `source`, pooled by `pooling` and normalised, as `out/model.onnx`:
    inputs `input_ids` and `attention_mask` (batch × tokens, int64), output `embedding`
    (batch × dimension, float32, unit rows). Runs in the exporting child process."""
    import inspect

    import torch
    from transformers import AutoModel

    torch.set_num_threads(1)
    model = AutoModel.from_pretrained(str(source)).eval()

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            states = self.model(input_ids=input_ids, attention_mask=attention_mask)[0]
            weights = attention_mask.unsqueeze(-1).to(states.dtype)
            if pooling == "cls":
                pooled = states[:, 0]
            elif pooling == "max":
                pooled = states.masked_fill(weights == 0, -1e9).max(dim=1).values
            else:
                pooled = (states * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    # Two rows of different lengths, so the traced graph pads and masks like a real batch.
    ids = torch.tensor([[101, 2023, 2003, 102, 0], [101, 2023, 2003, 2742, 102]])
    mask = (ids != 0).to(torch.int64)
    options: dict[str, Any] = {}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        options["dynamo"] = False  # the TorchScript exporter: no onnxscript needed
    with torch.no_grad():
        torch.onnx.export(
            Pooled(),
            (ids, mask),
            str(out / GRAPH),
            input_names=["input_ids", "attention_mask"],
            output_names=["embedding"],
            dynamic_axes={
                "input_ids": {0: "batch", 1: "tokens"},
                "attention_mask": {0: "batch", 1: "tokens"},
                "embedding": {0: "batch"},
            },
            opset_version=OPSET,
            **options,
        )
    import onnx

    graph = onnx.load(str(out / GRAPH))
    onnx.save_model(
        graph,
        str(out / GRAPH),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=WEIGHTS,
        size_threshold=1024,  # the small ones stay in the graph
    )


class OnnxEmbedder:
    """`fallback`'s model (a local sentence-transformers model that pools by `pooling`) run in
    ONNX Runtime: the same `model_id`, dimension, token limit and counter; exported on the first
    `embed`, so opening an index that is up to date costs nothing."""

    def __init__(
        self,
        fallback: SentenceTransformerEmbedder,
        source: Path,
        pooling: str,
        cache_dir: Path,
        *,
        batch_size: int = 32,
        threads: int = 0,
    ) -> None:
        self.fallback = fallback
        self.model_id = fallback.model_id
        self.dimension = fallback.dimension
        self.max_tokens = fallback.max_tokens
        self.counter = fallback.counter
        self._source = source
        self._pooling = pooling
        self._cache_dir = cache_dir
        self._batch_size = batch_size
        self.threads = threads or max(1, os.cpu_count() or 1)
        self._lock = threading.Lock()
        self._session: Any = None
        self._run_options: Any = None
        self._tokenizer: Any = None
        self.failure: str | None = None  # why the export failed: the fallback runs instead

    @property
    def engine(self) -> str:
        """What runs the model: `onnxruntime`, or sentence-transformers after a failed export."""
        return self.fallback.engine if self.failure is not None else "onnxruntime"

    @property
    def loaded(self) -> bool:
        return self._session is not None or self.fallback.loaded

    def _load(self) -> bool:
        """Load the session once; False when the export failed (the fallback serves)."""
        if self._session is not None:
            return True
        if self.failure is not None:
            return False
        try:
            path = ensure_exported(
                self._source, self.fallback.fingerprint, self._pooling, self._cache_dir
            )
        except (ExportError, OSError) as exc:
            self.failure = str(exc)
            log.warning(
                "the embedding model could not be exported to ONNX; running it in "
                "sentence-transformers instead: %s",
                exc,
            )
            return False
        import onnxruntime as ort
        from tokenizers import Tokenizer

        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.enable_mem_pattern = False  # batches vary in shape
        # Leave idle cores to the completion engine rather than spin on them.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # Batches come in bursts: the arena gives its buffers back after each (a batch of 32
        # chunks of 128 tokens needs about 150 MB for a moment; docs/indexer.md).
        self._run_options = ort.RunOptions()
        self._run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        tokenizer = Tokenizer.from_file(str(self._source / "tokenizer.json"))
        tokenizer.no_padding()
        tokenizer.enable_truncation(self.fallback.max_seq_length)
        self._tokenizer = tokenizer
        self._session = ort.InferenceSession(
            str(path / GRAPH), options, providers=["CPUExecutionProvider"]
        )
        # The matrices were read once into the engine's packed copies; only the embedding tables
        # are read from the file again, a row per token.
        release_mapped_file(path / WEIGHTS)
        return True

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        with self._lock:
            if not self._load():
                return self.fallback.embed(texts)
            encodings = self._tokenizer.encode_batch(list(texts))
            # Longest first, as sentence-transformers batches: little padding within a batch.
            order = sorted(range(len(texts)), key=lambda i: -len(encodings[i].ids))
            vectors = np.empty((len(texts), self.dimension), dtype=np.float32)
            for start in range(0, len(order), self._batch_size):
                rows = order[start : start + self._batch_size]
                width = max(len(encodings[i].ids) for i in rows)
                ids = np.zeros((len(rows), width), dtype=np.int64)
                mask = np.zeros((len(rows), width), dtype=np.int64)
                for row, i in enumerate(rows):
                    tokens = encodings[i].ids
                    ids[row, : len(tokens)] = tokens
                    mask[row, : len(tokens)] = 1
                feed = {"input_ids": ids, "attention_mask": mask}
                vectors[rows] = self._session.run(["embedding"], feed, self._run_options)[0]
            if len(texts) > QUERY_TEXTS:
                trim_heap()
        return vectors


def _local_path(model: str) -> Path | None:
    if model == BUNDLED:
        return bundled_model_path()
    path = Path(model).expanduser()
    return path.resolve() if path.is_dir() else None


def runs_in_onnx(model: str, engine: str) -> bool:
    """Whether `load_embedder(model, engine=engine)` runs the model in ONNX Runtime: `engine` is
    `onnxruntime` and `model` a local model of the plain shape. Reads config files only."""
    path = _local_path(model) if engine == "onnxruntime" else None
    return path is not None and describe_local_model(path) is not None and bool(pooling_mode(path))


def load_embedder(
    model: str = BUNDLED,
    *,
    cache_dir: Path | None,
    batch_size: int = 32,
    engine: str = "onnxruntime",
) -> Embedder:
    """The index's embedder for `model` (`index.embeddingModel`) and `engine`
    (`index.embeddingEngine`): `OnnxEmbedder` where `runs_in_onnx` says so (and there is a cache
    directory to export into), else sentence-transformers."""
    fallback = SentenceTransformerEmbedder(model, batch_size=batch_size)
    path = fallback.local_path
    if cache_dir is None or path is None or not runs_in_onnx(str(path), engine):
        return fallback
    pooling = pooling_mode(path) or "mean"
    return OnnxEmbedder(fallback, path, pooling, cache_dir, batch_size=batch_size)


if __name__ == "__main__":  # the exporting child: SOURCE OUT POOLING
    export(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
