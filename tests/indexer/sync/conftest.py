"""Fixtures of the index sync tests: the real backend, real index stores, keyed clients."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from indexer.scan import FileStat, leaf_hash
from indexer.store import FileUpdate, IndexStore
from indexer.sync_client import SyncClient
from indexer.sync_keys import SyncKeys
from indexer.types import Chunk
from tests.indexer.conftest import copy_stdlib, quiet_settings
from tests.support.backend_server import (
    BackendServer,
    backend,
    db_url,
    postgres_db,
    sqlite_backend,
)
from tests.support.embedders import HashingEmbedder

__all__ = [
    "backend",
    "copy_stdlib",
    "db_url",
    "postgres_db",
    "quiet_settings",
    "sqlite_backend",
]

SECRET = "team secret for the sync tests"


def line_chunks(path: str, text: str) -> list[Chunk]:
    """One chunk per non-blank line: enough structure for protocol tests, no grammar needed."""
    return [
        Chunk(path, number, number + 1, "text", line)
        for number, line in enumerate(text.splitlines())
        if line.strip()
    ]


class FileIndex:
    """A real `IndexStore` filled from `{path: text}` without scanning a disk."""

    def __init__(self, directory: Path, embedder: HashingEmbedder) -> None:
        self.embedder = embedder
        self.store = IndexStore(directory, dimension=embedder.dimension, model_id=embedder.model_id)
        self.files: dict[str, str] = {}

    def put(self, path: str, text: str) -> None:
        data = text.encode()
        chunks = line_chunks(path, text)
        vectors = {}
        if chunks:
            embedded = self.embedder.embed([c.text for c in chunks])
            vectors = {c.id: v for c, v in zip(chunks, embedded, strict=True)}
        stat = FileStat(1, len(data), 1, leaf_hash(data))
        self.store.apply([FileUpdate(path, stat, chunks, vectors)], [])
        self.files[path] = text

    def remove(self, path: str) -> None:
        self.store.apply([], [path])
        del self.files[path]

    def close(self) -> None:
        self.store.close()


@pytest.fixture
def file_index(tmp_path: Path) -> Iterator[Callable[[str], FileIndex]]:
    """`file_index(name)`: an empty real index store, closed after the test."""
    opened: list[FileIndex] = []

    def factory(name: str) -> FileIndex:
        index = FileIndex(tmp_path / name, HashingEmbedder())
        opened.append(index)
        return index

    yield factory
    for index in opened:
        index.close()


@pytest.fixture
def keys() -> SyncKeys:
    return SyncKeys(SECRET)


def client_for(server: BackendServer, token: str | None = None) -> SyncClient:
    """A sync client of `server` (its tenant, or the tenant of `token`), fast retries."""
    return SyncClient(server.url, token or server.token, retry_deadline_s=2.0)


def unit(vector: np.ndarray) -> np.ndarray:
    return vector / np.linalg.norm(vector)


FIELDS = {"workspace", "model", "dirs", "keys", "upserts", "removes", "vectors", "root", "path"}
FIELDS |= {"leaf", "chunks", "dtype", "dimension", "items"}


def assert_opaque(value: Any) -> None:
    """Every string a sync body holds is a hex id or hash, a dtype, or a base64 vector."""
    if isinstance(value, dict):
        for key, item in value.items():
            assert key in FIELDS or re.fullmatch(r"[0-9a-f]{32}", key), key
            assert_opaque(item)
    elif isinstance(value, list):
        for item in value:
            assert_opaque(item)
    elif isinstance(value, str):
        assert (
            re.fullmatch(r"[0-9a-f/]*", value)
            or value in ("float16", "float32")
            or re.fullmatch(r"[A-Za-z0-9+/]{40,}={0,2}", value)
        ), value
