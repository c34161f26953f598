"""The sync protocol against the real backend: roots agree after any history of changes."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from indexer.merkle import EMPTY_ROOT
from indexer.sync import sync_index
from indexer.sync_keys import SyncKeys
from tests.indexer.sync.conftest import FileIndex, client_for
from tests.support.backend_server import BackendServer
from tests.support.embedders import HashingEmbedder

# fsync is free on tmpfs; the local store commits after every edit.
FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") else None
SEGMENTS = ["a", "b", "src", "lib.py", "x"]
paths = st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=4).map("/".join)
texts = st.lists(
    st.sampled_from(["def f():", "    return 1", "", "x = 2", "class K:", "import os"]),
    max_size=6,
).map("\n".join)
edits = st.one_of(
    st.tuples(st.just("write"), paths, texts),
    st.tuples(st.just("delete"), paths, st.just("")),
    st.tuples(st.just("rename"), paths, paths),
    st.tuples(st.just("sync"), st.just(""), st.just("")),
)


def _write(index: FileIndex, path: str, text: str) -> None:
    """Write a file the way a file system allows: it replaces a file or directory in its way."""
    for existing in list(index.files):
        if existing.startswith(path + "/") or path.startswith(existing + "/"):
            index.remove(existing)
    index.put(path, text)


def _apply(index: FileIndex, kind: str, first: str, second: str) -> None:
    if kind == "write":
        _write(index, first, second)
    elif kind == "delete" and first in index.files:
        index.remove(first)
    elif kind == "rename" and first in index.files and first != second:
        text = index.files[first]
        index.remove(first)
        _write(index, second, text)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(history=st.lists(edits, max_size=14))
def test_any_history_of_changes_syncs_to_equal_roots(
    backend: BackendServer, keys: SyncKeys, history: list[tuple[str, str, str]]
) -> None:
    client = client_for(backend)
    workspace = keys.workspace(uuid.uuid4().hex)
    with tempfile.TemporaryDirectory(dir=FAST_TMP) as tmp:
        index = FileIndex(Path(tmp), HashingEmbedder())
        try:
            for kind, first, second in [*history, ("sync", "", "")]:
                if kind != "sync":
                    _apply(index, kind, first, second)
                    continue
                report = sync_index(index.store, keys, client, workspace)
                local, _ = keys.tree(index.store.leaves())
                assert report.root == local.root_hash.hex()
                model = keys.model(index.store.model_id)
                assert client.root(workspace, model) == local.root_hash.hex()
                # A second sync finds nothing to do.
                assert sync_index(index.store, keys, client, workspace).in_sync_before
        finally:
            index.close()
            client.close()


def test_an_empty_workspace_has_the_empty_root(
    sqlite_backend: BackendServer, keys: SyncKeys
) -> None:
    client = client_for(sqlite_backend)
    try:
        assert client.root(keys.workspace("w"), keys.model("m")) == EMPTY_ROOT.hex()
    finally:
        client.close()


def test_server_stores_placements_under_keyed_paths(
    sqlite_backend: BackendServer, keys: SyncKeys, file_index: Callable[[str], FileIndex]
) -> None:
    index = file_index("one")
    index.put("pkg/mod.py", "import os\n\ndef f():\n    return 1\n")
    client = client_for(sqlite_backend)
    workspace = keys.workspace("w")
    try:
        sync_index(index.store, keys, client, workspace)
    finally:
        client.close()
    model = keys.model(index.store.model_id)
    store = sqlite_backend.services.index_sync
    keyed = keys.path("pkg/mod.py")
    placed = store.placements(sqlite_backend.tenant_id, workspace, model, [keyed])[keyed]
    chunks = index.store.chunks_of("pkg/mod.py")
    assert placed == [(keys.chunk(c.id), c.start_line, c.end_line) for c in chunks]
    assert [start for _, start, _ in placed] == [0, 2, 3]


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_vectors_round_trip_in_either_dtype(
    sqlite_backend: BackendServer,
    keys: SyncKeys,
    file_index: Callable[[str], FileIndex],
    dtype: str,
) -> None:
    index = file_index(dtype)
    index.put("m.py", "alpha beta\ngamma delta\n")
    client = client_for(sqlite_backend)
    try:
        report = sync_index(index.store, keys, client, keys.workspace(dtype), dtype=dtype)
        assert report.vectors_uploaded == 2
        ids = [c.id for c in index.store.chunks_of("m.py")]
        local = index.store.known_vectors(ids)
        remote = client.vectors(keys.model(index.store.model_id), [keys.chunk(i) for i in ids])
        tolerance = 1e-3 if dtype == "float16" else 0.0
        for chunk in ids:
            assert abs(remote[keys.chunk(chunk)] - local[chunk]).max() <= tolerance
    finally:
        client.close()
