"""What the server sees, who can read it, and what it refuses."""

from __future__ import annotations

import base64
import gzip
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from indexer.merkle import EMPTY_ROOT
from indexer.sync import sync_index
from indexer.sync_client import SyncClient, SyncRejected
from indexer.sync_keys import SyncKeys
from tests.indexer.sync.conftest import FileIndex, assert_opaque, client_for
from tests.support.backend_server import BackendServer

CANARY_PATH = "zebracanary_pkg/platypus_module.py"
CANARY_LINE = "CANARY_SECRET_TOKEN = 'wombat-on-a-unicycle'"
SOURCE = {
    CANARY_PATH: f"import os\n{CANARY_LINE}\n\ndef quokka_handler(request):\n    return None\n",
    "zebracanary_pkg/__init__.py": "from .platypus_module import quokka_handler\n",
    "README_kangaroo.md": "Echidna notes: never leave the machine.\n",
}


@pytest.fixture
def synced(
    backend: BackendServer, keys: SyncKeys, file_index: Callable[[str], FileIndex]
) -> Iterator[tuple[BackendServer, FileIndex, str]]:
    """Tenant A's workspace, synced; yields (server, index, keyed workspace id)."""
    index = file_index("a")
    for path, text in SOURCE.items():
        index.put(path, text)
    workspace = keys.workspace("/home/alice/zebracanary")
    client = client_for(backend)
    try:
        sync_index(index.store, keys, client, workspace)
    finally:
        client.close()
    yield backend, index, workspace


def test_no_body_carries_a_path_segment_or_a_line_of_source(
    synced: tuple[BackendServer, FileIndex, str],
) -> None:
    server, _, _ = synced
    bodies = server.bodies
    assert len(bodies) >= 3
    words = {part for path in SOURCE for part in re.split(r"[/.]", path) if len(part) >= 4}
    words |= {"zebracanary", "alice", "wombat", "quokka", "Echidna"}
    lines = {line.strip() for text in SOURCE.values() for line in text.splitlines()}
    for body in bodies:
        text = body.decode("utf-8", "replace")
        for word in words:
            assert word not in text, word
        for line in lines:
            if len(line) >= 8:
                assert line not in text, line
        assert_opaque(json.loads(text))


def test_another_tenant_gets_nothing(
    synced: tuple[BackendServer, FileIndex, str], keys: SyncKeys
) -> None:
    server, index, workspace = synced
    model = keys.model(index.store.model_id)
    chunk_keys = [keys.chunk(c.id) for c in index.store.chunks_of(CANARY_PATH)]
    dirs = ["", keys.path("zebracanary_pkg")]
    owner = client_for(server)
    intruder = client_for(server, server.storage.create_token("tenant-b"))
    try:
        root = owner.root(workspace, model)
        assert root != EMPTY_ROOT.hex()
        assert owner.known(model, chunk_keys) == set(chunk_keys)
        assert set(owner.vectors(model, chunk_keys)) == set(chunk_keys)
        assert owner.children(workspace, model, dirs)[""]

        assert intruder.root(workspace, model) == EMPTY_ROOT.hex()
        assert intruder.children(workspace, model, dirs) == {d: [] for d in dirs}
        assert intruder.known(model, chunk_keys) == set()
        assert intruder.vectors(model, chunk_keys) == {}
        # Placing A's chunk keys without the vectors is refused: B cannot link to A's vectors.
        leaf = "0" * 64
        placing = {
            "workspace": workspace,
            "model": model,
            "upserts": [
                {"path": keys.path("x.py"), "leaf": leaf, "chunks": [[chunk_keys[0], 0, 1]]}
            ],
        }
        with pytest.raises(SyncRejected) as refused:
            intruder.apply(placing)
        assert refused.value.status == 422
        # B removing A's paths, or writing its own tree under A's ids, leaves A's tree alone.
        intruder.apply({"workspace": workspace, "model": model, "removes": [dirs[1]]})
        assert owner.root(workspace, model) == root
        assert owner.children(workspace, model, dirs)[dirs[1]]
    finally:
        owner.close()
        intruder.close()


def test_a_wrong_claimed_root_is_refused_and_nothing_is_kept(
    synced: tuple[BackendServer, FileIndex, str], keys: SyncKeys
) -> None:
    server, index, workspace = synced
    model = keys.model(index.store.model_id)
    client = client_for(server)
    try:
        before = client.root(workspace, model)
        with pytest.raises(SyncRejected) as refused:
            client.apply(
                {
                    "workspace": workspace,
                    "model": model,
                    "removes": [keys.path("README_kangaroo.md")],
                    "root": "ab" * 32,
                }
            )
        assert refused.value.status == 409
        assert client.root(workspace, model) == before
    finally:
        client.close()


def _post(server: BackendServer, path: str, body: Any, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        f"{server.url}{path}",
        content=content,
        headers={"Authorization": f"Bearer {server.token}", **headers},
        timeout=30,
    )


K = "a" * 32
H = "b" * 64
WS = {"workspace": K, "model": K}


def _vector(values: list[float], dtype: str = "float32") -> str:
    return base64.b64encode(np.asarray(values, dtype=dtype).tobytes()).decode()


HOSTILE = [
    pytest.param("/v1/index/root", b"{not json", 400, id="not-json"),
    pytest.param("/v1/index/root", [1, 2], 422, id="not-an-object"),
    pytest.param("/v1/index/root", {"workspace": "../etc", "model": K}, 422, id="bad-workspace"),
    pytest.param("/v1/index/root", {**WS, "extra": 1}, 422, id="unknown-field"),
    pytest.param("/v1/index/children", {**WS, "dirs": ["A" * 32]}, 422, id="uppercase-id"),
    pytest.param("/v1/index/children", {**WS, "dirs": [""] * 5000}, 413, id="huge-level"),
    pytest.param("/v1/index/known", {"model": K, "keys": [K] * 9000}, 413, id="huge-keys"),
    pytest.param("/v1/index/vectors", {"model": K, "keys": [K] * 5000}, 413, id="huge-fetch"),
    pytest.param(
        "/v1/index/apply",
        {**WS, "upserts": [{"path": "/".join([K] * 61), "leaf": H}]},
        422,
        id="too-deep",
    ),
    pytest.param(
        "/v1/index/apply", {**WS, "upserts": [{"path": K, "leaf": "zz"}]}, 422, id="bad-leaf"
    ),
    pytest.param(
        "/v1/index/apply",
        {**WS, "upserts": [{"path": K, "leaf": H}, {"path": f"{K}/{K}", "leaf": H}]},
        422,
        id="file-under-file",
    ),
    pytest.param(
        "/v1/index/apply",
        {**WS, "upserts": [{"path": K, "leaf": H}, {"path": K, "leaf": H}]},
        422,
        id="placed-twice",
    ),
    pytest.param(
        "/v1/index/apply",
        {**WS, "upserts": [{"path": K, "leaf": H}], "removes": [K]},
        422,
        id="placed-and-removed",
    ),
    pytest.param(
        "/v1/index/apply",
        {**WS, "upserts": [{"path": K, "leaf": H, "chunks": [[K, 5, 5]]}]},
        422,
        id="empty-range",
    ),
    pytest.param(
        "/v1/index/apply",
        {**WS, "upserts": [{"path": K, "leaf": H, "chunks": [[K, -1, 5]]}]},
        422,
        id="negative-line",
    ),
    pytest.param(
        "/v1/index/apply",
        {**WS, "upserts": [{"path": K, "leaf": H, "chunks": [[K, 0, 1]]}]},
        422,
        id="chunk-without-vector",
    ),
    pytest.param(
        "/v1/index/apply",
        {**WS, "vectors": {"dtype": "float32", "dimension": 4, "items": {K: _vector([1, 0])}}},
        422,
        id="vector-wrong-length",
    ),
    pytest.param(
        "/v1/index/apply",
        {
            **WS,
            "vectors": {
                "dtype": "float32",
                "dimension": 2,
                "items": {K: _vector([float("nan"), 0])},
            },
        },
        422,
        id="vector-not-finite",
    ),
    pytest.param(
        "/v1/index/apply",
        {**WS, "vectors": {"dtype": "float32", "dimension": 2, "items": {K: "!!notbase64"}}},
        422,
        id="vector-not-base64",
    ),
    pytest.param(
        "/v1/index/apply",
        {**WS, "vectors": {"dtype": "int8", "dimension": 2, "items": {}}},
        422,
        id="vector-dtype",
    ),
    pytest.param(
        "/v1/index/apply",
        {**WS, "vectors": {"dtype": "float32", "dimension": 100000, "items": {}}},
        422,
        id="vector-dimension",
    ),
    pytest.param(
        "/v1/index/apply",
        {**WS, "upserts": [{"path": f"{K[:-1]}{i % 10}", "leaf": H} for i in range(4097)]},
        413,
        id="huge-apply",
    ),
]


@pytest.mark.parametrize(("path", "body", "status"), HOSTILE)
def test_hostile_messages_get_a_clear_4xx(
    sqlite_backend: BackendServer, path: str, body: Any, status: int
) -> None:
    response = _post(sqlite_backend, path, body)
    assert response.status_code == status, response.text
    assert response.json()["detail"]
    # The server is fine afterwards.
    assert _post(sqlite_backend, "/v1/index/root", WS).status_code == 200


def test_bodies_over_the_cap_and_gzip_bombs_are_refused(sqlite_backend: BackendServer) -> None:
    bomb = gzip.compress(b'{"model": "' + b"a" * (40 * 1024 * 1024) + b'"}')
    assert len(bomb) < 100_000
    response = _post(sqlite_backend, "/v1/index/known", bomb, **{"Content-Encoding": "gzip"})
    assert response.status_code == 413


def test_a_second_dimension_for_one_model_is_refused(sqlite_backend: BackendServer) -> None:
    upload = {"dtype": "float32", "dimension": 2, "items": {K: _vector([0.6, 0.8])}}
    assert _post(sqlite_backend, "/v1/index/apply", {**WS, "vectors": upload}).status_code == 200
    other = {"dtype": "float32", "dimension": 3, "items": {"c" * 32: _vector([1, 0, 0])}}
    response = _post(sqlite_backend, "/v1/index/apply", {**WS, "vectors": other})
    assert response.status_code == 422 and "dimension" in response.json()["detail"]


@pytest.mark.parametrize("path", ["root", "children", "known", "vectors", "apply"])
def test_every_endpoint_needs_a_token(sqlite_backend: BackendServer, path: str) -> None:
    response = httpx.post(f"{sqlite_backend.url}/v1/index/{path}", json=WS, timeout=10)
    assert response.status_code == 401


def test_a_client_without_a_token_fails_cleanly(sqlite_backend: BackendServer) -> None:
    client = SyncClient(sqlite_backend.url, "tl_wrong", retry_deadline_s=1)
    try:
        with pytest.raises(SyncRejected) as refused:
            client.root(K, K)
        assert refused.value.status == 401
    finally:
        client.close()
