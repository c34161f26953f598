"""The FAISS index over chunk vectors: exact inner product, or HNSW past a size.

Vectors are unit length, so inner product is cosine similarity. Ids are the chunk rows of the
metadata database (`IndexIDMap2`). HNSW cannot delete, so removals there become tombstones that
searches skip; the graph is rebuilt without them once they are a quarter of it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import faiss
import numpy as np

HNSW_NEIGHBOURS = 32
HNSW_EF_CONSTRUCTION = 80
HNSW_EF_SEARCH = 96


class VectorIndex:
    """Chunk vectors by id. Not thread-safe; the store serialises access."""

    def __init__(self, dimension: int, hnsw_threshold: int = 0) -> None:
        self.dimension = dimension
        self.hnsw_threshold = hnsw_threshold
        self.index: faiss.IndexIDMap2 = self._flat()
        self.dead: set[int] = set()

    def _flat(self) -> faiss.IndexIDMap2:
        return faiss.IndexIDMap2(faiss.IndexFlatIP(self.dimension))

    def _hnsw(self) -> faiss.IndexIDMap2:
        graph = faiss.IndexHNSWFlat(self.dimension, HNSW_NEIGHBOURS, faiss.METRIC_INNER_PRODUCT)
        graph.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        graph.hnsw.efSearch = HNSW_EF_SEARCH
        return faiss.IndexIDMap2(graph)

    @property
    def is_hnsw(self) -> bool:
        return isinstance(faiss.downcast_index(self.index.index), faiss.IndexHNSWFlat)

    @property
    def live(self) -> int:
        """Vectors that searches can return."""
        return int(self.index.ntotal) - len(self.dead)

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        if len(ids) == 0:
            return
        self.index.add_with_ids(
            np.ascontiguousarray(vectors, dtype=np.float32), np.asarray(ids, dtype=np.int64)
        )
        if self.hnsw_threshold and not self.is_hnsw and self.live > self.hnsw_threshold:
            self._rebuild(hnsw=True)

    def remove(self, ids: Iterable[int]) -> None:
        wanted = np.fromiter(ids, dtype=np.int64)
        if len(wanted) == 0:
            return
        if not self.is_hnsw:
            self.index.remove_ids(faiss.IDSelectorBatch(len(wanted), faiss.swig_ptr(wanted)))
            return
        self.dead.update(int(i) for i in wanted)
        if len(self.dead) * 4 > self.index.ntotal:
            self._rebuild(hnsw=self.live > self.hnsw_threshold)

    def _rebuild(self, hnsw: bool) -> None:
        ids, vectors = self.export()
        self.index = self._hnsw() if hnsw else self._flat()
        self.dead = set()
        if len(ids):
            self.index.add_with_ids(vectors, ids)

    def export(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, vectors) of every live vector."""
        count = int(self.index.ntotal)
        if count == 0:
            return np.zeros(0, np.int64), np.zeros((0, self.dimension), np.float32)
        ids = faiss.vector_to_array(self.index.id_map).astype(np.int64)
        vectors = self.index.index.reconstruct_n(0, count)
        if self.dead:
            keep = ~np.isin(ids, np.fromiter(self.dead, np.int64))
            ids, vectors = ids[keep], vectors[keep]
        return ids, np.ascontiguousarray(vectors, dtype=np.float32)

    def search(self, query: np.ndarray, k: int) -> list[tuple[int, float]]:
        """Up to `k` (id, score) pairs, best first."""
        if self.live <= 0 or k <= 0:
            return []
        fetch = min(int(self.index.ntotal), k + len(self.dead))
        scores, ids = self.index.search(np.asarray(query, np.float32).reshape(1, -1), fetch)
        hits = [
            (int(i), float(s))
            for i, s in zip(ids[0], scores[0], strict=True)
            if i >= 0 and int(i) not in self.dead
        ]
        return hits[:k]

    def serialize(self) -> bytes:
        return bytes(faiss.serialize_index(self.index))

    @classmethod
    def deserialize(
        cls, data: bytes, dimension: int, hnsw_threshold: int, dead: Iterable[int] = ()
    ) -> VectorIndex:
        """Load a serialised index; raises ValueError when it does not fit."""
        try:
            index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
        except RuntimeError as exc:
            raise ValueError(f"not a FAISS index: {exc}") from exc
        if index.d != dimension:
            raise ValueError(f"index has dimension {index.d}, expected {dimension}")
        loaded = cls(dimension, hnsw_threshold)
        # Keep the object deserialize_index returned: it owns the memory (a downcast view of
        # it would not, and the index would be freed under us).
        if not isinstance(index, faiss.IndexIDMap2):
            raise ValueError(f"unexpected index type {type(index).__name__}")
        loaded.index = index
        loaded.dead = set(dead)
        return loaded

    def memory_bytes(self) -> int:
        """Bytes the index would take serialised: close to its resident size."""
        return len(faiss.serialize_index(self.index))


def checksum(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
