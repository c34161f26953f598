"""`GET /v1/model` and `GET /v1/model/files/{name}`: the tenant's serving adapter, on loopback."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend.adapters.registry import TenantAdapterRegistry
from backend.adapters.run import tenant_registry
from completion.adapters import CONFIG, MANIFEST, WEIGHTS, save_adapter
from completion.runners.loading import load_model, resolve_source
from tests.support.backend_server import BackendServer
from tests.support.fake_adapter import blob_path, damage_blob
from training.lora import LoraShape, attach_lora
from training.registry import scope_dir


@pytest.fixture
def served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model_path: Path
) -> Iterator[tuple[BackendServer, TenantAdapterRegistry, Path]]:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TABLOOP_CACHE_DIR", str(cache))
    source = resolve_source(str(tiny_model_path), cache)
    _tokenizer, model = load_model(source, "float32", cache)
    adapter = tmp_path / "adapter"
    base = f"{source.name}@{source.revision}"
    save_adapter(attach_lora(model, LoraShape(rank=2, alpha=4)), adapter, base, {})
    with BackendServer(f"sqlite:///{tmp_path / 'db.sqlite3'}") as backend:
        assert backend.services.cache_dir == cache
        registry = tenant_registry(backend.storage, cache, backend.tenant)
        yield backend, registry, adapter


def _get(backend: BackendServer, path: str, **headers: str) -> httpx.Response:
    return httpx.get(
        backend.url + path, headers={"Authorization": f"Bearer {backend.token}", **headers}
    )


def test_the_serving_version_its_checksums_and_files(
    served: tuple[BackendServer, TenantAdapterRegistry, Path],
) -> None:
    backend, registry, adapter = served
    nothing = _get(backend, "/v1/model")
    assert nothing.status_code == 200 and nothing.json()["version"] is None
    assert _get(backend, f"/v1/model/files/{WEIGHTS}").status_code == 404

    record = registry.add(adapter, registry_base(adapter), {})
    assert _get(backend, "/v1/model").json()["version"] is None  # a candidate does not serve
    registry.promote(record.version, force=True)
    answer = _get(backend, "/v1/model")
    assert answer.status_code == 200
    body = answer.json()
    assert body["version"] == "v0001" and answer.headers["X-Tabloop-Model-Version"] == "v0001"
    weights = _get(backend, f"/v1/model/files/{WEIGHTS}")
    assert weights.status_code == 200
    assert hashlib.sha256(weights.content).hexdigest() == body["files"][WEIGHTS]
    manifest = _get(backend, f"/v1/model/files/{MANIFEST}").content
    assert hashlib.sha256(manifest).hexdigest() == body["checksum"]
    assert answer.headers["ETag"] == f'"{body["checksum"]}"'
    unchanged = _get(backend, "/v1/model", **{"If-None-Match": answer.headers["ETag"]})
    assert unchanged.status_code == 304
    assert _get(backend, "/v1/model/files/..%2Fregistry.json").status_code == 404
    assert httpx.get(backend.url + "/v1/model").status_code == 401

    # A copy changed on this instance is fetched again from the blob store; a damaged blob,
    # with no good copy left here, is refused, never served.
    (registry.path(1) / WEIGHTS).write_bytes(b"not weights")
    again = _get(backend, f"/v1/model/files/{WEIGHTS}")
    assert again.status_code == 200 and again.content == weights.content
    damage_blob(registry, 1)
    (registry.root / "v0001" / WEIGHTS).write_bytes(b"not weights")
    refused = _get(backend, "/v1/model")
    assert refused.status_code == 503 and "v0001" in refused.json()["detail"]
    assert "is damaged" in refused.json()["detail"]
    registry.rollback()
    assert _get(backend, "/v1/model").json()["version"] is None


def registry_base(adapter: Path) -> str:
    import json

    return str(json.loads((adapter / MANIFEST).read_text())["base_model"])


# -- damaged versions and registries (no model needed: the files are checked, not loaded) -----


def _fake_adapter(directory: Path, weights: bytes = b"\x00" * 4096) -> Path:
    import json

    directory.mkdir(parents=True)
    (directory / CONFIG).write_text('{"r": 2}\n')
    (directory / WEIGHTS).write_bytes(weights)
    files = {
        name: hashlib.sha256((directory / name).read_bytes()).hexdigest()
        for name in (CONFIG, WEIGHTS)
    }
    (directory / MANIFEST).write_text(json.dumps({"base_model": "base@1", "files": files}))
    return directory


@pytest.fixture
def fake_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[BackendServer, TenantAdapterRegistry]]:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TABLOOP_CACHE_DIR", str(cache))
    with BackendServer(f"sqlite:///{tmp_path / 'db.sqlite3'}") as backend:
        registry = tenant_registry(backend.storage, cache, backend.tenant)
        record = registry.add(_fake_adapter(tmp_path / "adapter"), "base@1", {})
        registry.promote(record.version, force=True)
        yield backend, registry


def _flip_byte(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0x01
    path.write_bytes(bytes(data))


def _damage_config(path: Path) -> None:
    path.write_text('{"r": 3}\n')


def _damage_manifest(path: Path) -> None:
    path.write_text("not json {")


@pytest.mark.parametrize(
    ("damaged", "damage"),
    [
        pytest.param(WEIGHTS, _flip_byte, id="weights-one-flipped-byte"),
        pytest.param(CONFIG, _damage_config, id="config-changed"),
        pytest.param(MANIFEST, _damage_manifest, id="manifest-not-json"),
    ],
)
def test_a_damaged_version_serves_none_of_its_files(
    fake_served: tuple[BackendServer, TenantAdapterRegistry], damaged: str, damage: Any
) -> None:
    backend, registry = fake_served
    for name in (CONFIG, WEIGHTS, MANIFEST):
        assert _get(backend, f"/v1/model/files/{name}").status_code == 200
    damage(blob_path(registry, 1, damaged))  # in the store, and in this instance's copy
    damage(registry.path(1) / damaged)
    for path in ["/v1/model", *(f"/v1/model/files/{n}" for n in (CONFIG, WEIGHTS, MANIFEST))]:
        answer = _get(backend, path)
        assert answer.status_code == 503, (path, answer.status_code)
        assert str(registry.root.parent.parent) not in answer.text
        assert "/" not in answer.json()["detail"], answer.json()["detail"]
        assert "v0001" in answer.json()["detail"]


@pytest.mark.parametrize(
    "registry_text",
    [
        pytest.param('{"versions": [], "serving": "abc", "history": []}', id="serving-a-string"),
        pytest.param('{"versions": {}, "serving": 1}', id="versions-not-a-list"),
        pytest.param("[1, 2]", id="not-an-object"),
        pytest.param("{not json", id="not-json"),
    ],
)
def test_a_file_registry_of_the_wrong_shape_is_503_without_paths(
    fake_served: tuple[BackendServer, TenantAdapterRegistry], registry_text: str
) -> None:
    """A tenant's file registry from before is copied into the database on first use; one that
    cannot be read is refused, naming no path."""
    backend, _registry = fake_served
    token = backend.storage.create_token("older")
    root = scope_dir(backend.services.cache_dir, tenant="older")
    root.mkdir(parents=True)
    (root / "registry.json").write_text(registry_text)
    for route in ("/v1/model", f"/v1/model/files/{WEIGHTS}"):
        answer = httpx.get(backend.url + route, headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 503, (route, answer.text)
        assert str(root) not in answer.text and "/" not in answer.json()["detail"]


def test_a_verified_version_is_not_hashed_again_until_a_file_changes(
    fake_served: tuple[BackendServer, TenantAdapterRegistry],
) -> None:
    backend, registry = fake_served
    adapters = backend.services.served_adapters
    first = _get(backend, "/v1/model")
    assert first.status_code == 200
    hashed = adapters.verifications
    for _ in range(5):
        again = _get(backend, "/v1/model", **{"If-None-Match": first.headers["ETag"]})
        assert again.status_code == 304
        assert _get(backend, f"/v1/model/files/{WEIGHTS}").status_code == 200
    assert adapters.verifications == hashed
    copy = registry.root / "v0001" / WEIGHTS
    _flip_byte(copy)  # this instance's copy: checked again, and fetched again from the store
    assert _get(backend, "/v1/model", **{"If-None-Match": first.headers["ETag"]}).status_code == 304
    assert adapters.verifications > hashed
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == first.json()["files"][WEIGHTS]


def test_adapter_files_must_be_revalidated(
    fake_served: tuple[BackendServer, TenantAdapterRegistry],
) -> None:
    backend, _registry = fake_served
    description = _get(backend, "/v1/model").json()
    answer = _get(backend, f"/v1/model/files/{WEIGHTS}")
    assert answer.headers["Cache-Control"] == "no-cache"
    assert answer.headers["ETag"] == f'"{description["files"][WEIGHTS]}"'
    assert answer.headers["X-Tabloop-Model-Version"] == "v0001"
    assert (
        _get(
            backend, f"/v1/model/files/{WEIGHTS}", **{"If-None-Match": answer.headers["ETag"]}
        ).status_code
        == 304
    )
