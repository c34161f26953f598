"""Embedders for tests of the index's plumbing.

`HashingEmbedder` implements the `indexer.embed.Embedder` interface with hashed bag-of-words
vectors: deterministic, instant, and similar for texts that share words, which is all the store,
service and crash tests need. It is for tests only; search quality is tested with the real model.

`build_tiny_sentence_transformer` writes a randomly initialised one-layer BERT in
sentence-transformers format (with all-MiniLM-L6-v2's tokenizer), so the real loading and
encoding code runs in a fraction of a second. Random initialisation is not the same on every CPU,
so tests use the copy built once and committed (`tests.support.fixtures.tiny_embedder_path`).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from indexer.chunking import EstimatedCounter, TokenCounter

WORD = re.compile(r"[A-Za-z]+|\d+")


def _split_identifier(word: str) -> list[str]:
    parts = re.findall(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+", word)
    return [p.lower() for p in parts] or [word.lower()]


class HashingEmbedder:
    """Hashed bag of (sub)words, L2-normalised; counts the texts it embeds."""

    def __init__(self, dimension: int = 64, model_id: str = "test:hashing") -> None:
        self.dimension = dimension
        self.model_id = f"{model_id}:{dimension}"
        self.max_tokens = 254
        self.counter: TokenCounter = EstimatedCounter()
        self._lock = threading.Lock()
        self.calls = 0
        self.texts_embedded = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            self.calls += 1
            self.texts_embedded += len(texts)
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in WORD.findall(text):
                for part in _split_identifier(word):
                    digest = hashlib.blake2b(part.encode(), digest_size=8).digest()
                    out[row, int.from_bytes(digest[:4], "little") % self.dimension] += 1.0
            norm = float(np.linalg.norm(out[row]))
            out[row] = out[row] / norm if norm else 1.0 / np.sqrt(self.dimension)
        return out


def build_tiny_sentence_transformer(target: Path) -> Path:
    """A one-layer random BERT as a sentence-transformers directory at `target`."""
    if (target / "modules.json").is_file():
        return target
    import torch
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel

    from indexer.embed import bundled_model_path

    torch.manual_seed(0)
    bundled = bundled_model_path()
    staging = target.with_name(target.name + ".building")
    shutil.rmtree(staging, ignore_errors=True)
    bert_dir = staging / "bert"
    bert_dir.mkdir(parents=True)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    BertModel(config).save_pretrained(bert_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(bundled / name, bert_dir / name)
    transformer = models.Transformer(str(bert_dir), max_seq_length=128)
    pooling = models.Pooling(transformer.get_embedding_dimension(), "mean")
    model = SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu")
    model.save(str(staging / "model"))
    shutil.move(str(staging / "model"), str(target))
    shutil.rmtree(staging, ignore_errors=True)
    return target
