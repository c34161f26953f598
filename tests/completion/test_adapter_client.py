"""`AdapterFetcher` against the real backend on loopback: fetch, check, keep, survive faults."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backend.adapters.registry import TenantAdapterRegistry
from backend.adapters.run import tenant_registry
from completion.adapter_client import STATE_FILE, AdapterFetcher, AdapterFetchError
from completion.adapters import CONFIG, MANIFEST, WEIGHTS, save_adapter, verify_adapter
from completion.runners.loading import load_model, resolve_source
from tests.support.backend_server import BackendServer
from tests.support.fake_adapter import damage_blob
from training.lora import LoraShape, attach_lora


class Tenant:
    """A backend on loopback whose tenant has two adapter versions, neither serving yet."""

    def __init__(self, backend: BackendServer, registry: TenantAdapterRegistry, base: str) -> None:
        self.backend = backend
        self.registry = registry
        self.base = base

    def fetcher(self, root: Path, **kwargs: object) -> AdapterFetcher:
        return AdapterFetcher(self.backend.url, self.backend.token, root, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def tenant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model_path: Path
) -> Iterator[Tenant]:
    cache = tmp_path / "backend-cache"
    monkeypatch.setenv("TABLOOP_CACHE_DIR", str(cache))
    source = resolve_source(str(tiny_model_path), cache)
    _tokenizer, model = load_model(source, "float32", cache)
    base = f"{source.name}@{source.revision}"
    save_adapter(attach_lora(model, LoraShape(rank=2, alpha=4)), tmp_path / "a", base, {})
    with BackendServer(f"sqlite:///{tmp_path / 'db.sqlite3'}") as backend:
        registry = tenant_registry(backend.storage, cache, backend.tenant)
        registry.add(tmp_path / "a", base, {})
        registry.add(tmp_path / "a", base, {"note": "second"})
        yield Tenant(backend, registry, base)


def test_the_serving_version_is_fetched_checked_and_kept(tenant: Tenant, tmp_path: Path) -> None:
    root = tmp_path / "client"
    fetcher = tenant.fetcher(root)
    nothing = fetcher.fetch()
    assert nothing.version is None and nothing.path is None  # the base model serves

    tenant.registry.promote(1, force=True)
    first = fetcher.fetch()
    assert first.version == "v0001" and first.path is not None
    assert first.path.parent == root
    assert verify_adapter(first.path, tenant.base)["base_model"] == tenant.base
    for name in (CONFIG, WEIGHTS, MANIFEST):
        assert (first.path / name).read_bytes() == (tenant.registry.path(1) / name).read_bytes()
    assert fetcher.fetch() == first  # unchanged: a 304, nothing downloaded again

    tenant.registry.promote(2, force=True)
    second = fetcher.fetch()
    assert second.version == "v0002" and second.path != first.path
    tenant.registry.rollback()
    assert fetcher.fetch() == first  # kept: the rollback downloads nothing
    fetcher.close()

    # A new process starts from what was fetched last, before it reaches any backend.
    restarted = AdapterFetcher("http://127.0.0.1:9", tenant.backend.token, root, timeout_s=2)
    assert restarted.serving == first
    with pytest.raises(AdapterFetchError, match="unreachable"):
        restarted.fetch()
    assert restarted.serving == first
    # ... unless its copy was damaged since.
    (first.path / WEIGHTS).write_bytes(b"damaged")
    assert AdapterFetcher(tenant.backend.url, None, root).serving.path is None


def test_files_damaged_on_the_way_are_refused_and_nothing_changes(
    tenant: Tenant, tmp_path: Path
) -> None:
    """A man in the middle flips a byte of the weights: the checksum the backend announced
    catches it, the half-fetched copy is removed, and what served keeps serving."""
    damage = {"on": False}

    class Damaging(httpx.HTTPTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = super().handle_request(request)
            if damage["on"] and request.url.path.endswith(WEIGHTS):
                body = bytearray(response.read())
                body[len(body) // 2] ^= 0xFF
                return httpx.Response(
                    response.status_code, headers=response.headers, content=bytes(body)
                )
            return response

    root = tmp_path / "client"
    fetcher = tenant.fetcher(root, transport=Damaging())
    tenant.registry.promote(1, force=True)
    first = fetcher.fetch()
    tenant.registry.promote(2, force=True)
    damage["on"] = True
    with pytest.raises(AdapterFetchError, match="does not match the checksum"):
        fetcher.fetch()
    assert fetcher.serving == first
    assert json.loads((root / STATE_FILE).read_text())["version"] == "v0001"
    assert sorted(p.name for p in root.iterdir()) == sorted([first.path.name, STATE_FILE])  # type: ignore[union-attr]
    damage["on"] = False
    assert fetcher.fetch().version == "v0002"


def test_a_backend_that_refuses_says_why(tenant: Tenant, tmp_path: Path) -> None:
    wrong_token = AdapterFetcher(tenant.backend.url, "not-a-token", tmp_path / "client")
    with pytest.raises(AdapterFetchError, match="401"):
        wrong_token.fetch()
    tenant.registry.promote(1, force=True)
    damage_blob(tenant.registry, 1)  # in the backend's blob store, and its copy
    (tenant.registry.path(1) / WEIGHTS).write_bytes(b"damaged on the server")
    with pytest.raises(AdapterFetchError, match=r"503.*damaged"):
        tenant.fetcher(tmp_path / "client").fetch()


def test_old_versions_are_pruned(tenant: Tenant, tmp_path: Path) -> None:
    root = tmp_path / "client"
    fetcher = tenant.fetcher(root)
    for version in (1, 2, 1, 2):
        tenant.registry.promote(version, force=True)
        fetcher.fetch()
    third = tenant.registry.add(tenant.registry.path(1), tenant.base, {"note": "third"})
    tenant.registry.promote(third.version, force=True)
    assert fetcher.fetch().version == "v0003"
    kept = sorted(p.name.split("-")[0] for p in root.iterdir() if p.is_dir())
    assert kept == ["v0002", "v0003"]  # the serving one and the one before
