"""`GET /v1/model` and `GET /v1/model/files/{name}`: the tenant's serving adapter, on loopback."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from completion.adapters import MANIFEST, WEIGHTS, save_adapter
from completion.runners.loading import load_model, resolve_source
from tests.support.backend_server import BackendServer
from training.lora import LoraShape, attach_lora
from training.registry import AdapterRegistry, scope_dir


@pytest.fixture
def served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model_path: Path
) -> Iterator[tuple[BackendServer, AdapterRegistry, Path]]:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TABLOOP_CACHE_DIR", str(cache))
    source = resolve_source(str(tiny_model_path), cache)
    _tokenizer, model = load_model(source, "float32", cache)
    adapter = tmp_path / "adapter"
    base = f"{source.name}@{source.revision}"
    save_adapter(attach_lora(model, LoraShape(rank=2, alpha=4)), adapter, base, {})
    with BackendServer(f"sqlite:///{tmp_path / 'db.sqlite3'}") as backend:
        assert backend.services.cache_dir == cache
        registry = AdapterRegistry(scope_dir(cache, tenant=backend.tenant))
        yield backend, registry, adapter


def _get(backend: BackendServer, path: str, **headers: str) -> httpx.Response:
    return httpx.get(
        backend.url + path, headers={"Authorization": f"Bearer {backend.token}", **headers}
    )


def test_the_serving_version_its_checksums_and_files(
    served: tuple[BackendServer, AdapterRegistry, Path],
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

    # A damaged version is refused, never served.
    (registry.path(1) / WEIGHTS).write_bytes(b"not weights")
    assert _get(backend, "/v1/model").status_code == 503
    registry.rollback()
    assert _get(backend, "/v1/model").json()["version"] is None


def registry_base(adapter: Path) -> str:
    import json

    return str(json.loads((adapter / MANIFEST).read_text())["base_model"])
