"""Two backend instances on one PostgreSQL database and one blob store, each with a cache
directory of its own (no shared disk between them), serving a tenant's adapters over HTTP on
loopback: what one adds and promotes the other serves, with equal checksums; promotion refuses
the same things on either; a damaged blob is refused, never served."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from backend.adapters.registry import TenantAdapterRegistry
from backend.adapters.run import tenant_registry
from backend.adapters.scheduler import AdapterSchedule
from backend.local import LocalBackend
from backend.settings import BackendSettings
from completion.adapters import CONFIG, MANIFEST, WEIGHTS
from tabloop.model_cli import model_main
from tests.support.fake_adapter import FAKE_BASE_MODEL, damage_blob, fake_adapter
from training.registry import AdapterRegistryError


@dataclass
class Instance:
    backend: LocalBackend
    cache: Path
    registry: TenantAdapterRegistry

    def get(self, path: str) -> httpx.Response:
        return httpx.get(
            self.backend.url + path,
            headers={"Authorization": f"Bearer {self.backend.token}"},
            timeout=30,
        )


@pytest.fixture
def instances(postgres_db: str, tmp_path: Path) -> Iterator[tuple[Instance, Instance]]:
    tenant = f"team-{uuid.uuid4().hex[:8]}"  # the PostgreSQL database is the session's
    blobs = str(tmp_path / "blob-store")
    started: list[Instance] = []
    try:
        for name in ("one", "two"):
            cache = tmp_path / f"cache-{name}"
            settings = BackendSettings(
                db_url=postgres_db,
                cache_dir=cache,
                adapters=AdapterSchedule.off(blob_url=blobs),
            )
            backend = LocalBackend(postgres_db, tenant=tenant, settings=settings).start()
            registry = tenant_registry(backend.storage, cache, tenant, blobs)
            started.append(Instance(backend, cache, registry))
        yield started[0], started[1]
    finally:
        for instance in started:
            instance.backend.stop()


def _served(instance: Instance) -> tuple[dict[str, object], dict[str, bytes]]:
    described = instance.get("/v1/model")
    assert described.status_code == 200, described.text
    files = {}
    for name in (CONFIG, WEIGHTS, MANIFEST):
        answer = instance.get(f"/v1/model/files/{name}")
        assert answer.status_code == 200, answer.text
        files[name] = answer.content
    return described.json(), files


def test_a_version_promoted_through_one_instance_is_served_by_the_other(
    instances: tuple[Instance, Instance], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = instances
    assert two.get("/v1/model").json()["version"] is None
    one.registry.add(fake_adapter(tmp_path / "a1", 1), FAKE_BASE_MODEL, {})
    one.registry.add(fake_adapter(tmp_path / "a2", 2), FAKE_BASE_MODEL, {})
    monkeypatch.setenv("TABLOOP_CACHE_DIR", str(one.cache))
    scope = ["--tenant", one.registry.tenant, "--db", one.backend.db_url]
    scope += ["--blob-url", str(one.registry.blobs.url)]
    assert model_main(["promote", "1", "--force", "--canary-share", "0", *scope]) == 0

    body, files = _served(two)
    assert body["version"] == "v0001"
    assert body == _served(one)[0]
    assert hashlib.sha256(files[MANIFEST]).hexdigest() == body["checksum"]
    for name in (CONFIG, WEIGHTS):
        assert hashlib.sha256(files[name]).hexdigest() == body["files"][name]  # type: ignore[index]
    assert files[WEIGHTS] == (tmp_path / "a1" / WEIGHTS).read_bytes()
    # Served from the second instance's own copy, fetched from the store.
    assert (two.cache / "adapters" / f"tenant-{two.registry.tenant}" / "v0001").is_dir()

    # The same refusals on either instance: a canary started through one blocks a promotion
    # through the other, and the other's rollback ends it.
    assert "canary at 50%" in two.registry.promote(2, force=True, canary_share=0.5)
    assert model_main(["promote", "1", "--force", "--canary-share", "0", *scope]) == 1
    with pytest.raises(AdapterRegistryError, match="canary v0002 is running"):
        one.registry.promote(1, force=True)
    assert one.registry.rollback() == 1
    assert two.registry.canary() is None and two.get("/v1/model").json()["version"] == "v0001"
    with pytest.raises(AdapterRegistryError, match="not been evaluated"):
        two.registry.promote(2)
    assert [t["action"] for t in two.registry.transitions()] == [
        "promote",
        "canary",
        "canary-rollback",
    ]


def test_a_damaged_blob_is_refused_and_never_served(
    instances: tuple[Instance, Instance], tmp_path: Path
) -> None:
    one, two = instances
    one.registry.add(fake_adapter(tmp_path / "a1", 1), FAKE_BASE_MODEL, {})
    damage_blob(one.registry, 1, WEIGHTS)
    # The instance that added it holds an intact copy; the other has only the damaged blob.
    with pytest.raises(
        AdapterRegistryError, match=r"refusing a damaged adapter: blob \w+ is damaged"
    ):
        two.registry.promote(1, force=True)
    one.registry.promote(1, force=True, canary_share=0.0)
    assert one.get("/v1/model").json()["version"] == "v0001"
    for path in ("/v1/model", *(f"/v1/model/files/{n}" for n in (CONFIG, WEIGHTS, MANIFEST))):
        answer = two.get(path)
        assert answer.status_code == 503, (path, answer.text)
        detail = answer.json()["detail"]
        assert "v0001" in detail and "is damaged" in detail and "/" not in detail, detail
    assert not (two.cache / "adapters" / f"tenant-{two.registry.tenant}" / "v0001").exists()
    # Stored again whole (the same files added again), it is served by both.
    one.registry.add(fake_adapter(tmp_path / "again", 1), FAKE_BASE_MODEL, {})
    body, files = _served(two)
    assert body["version"] == "v0001"
    assert files[WEIGHTS] == (tmp_path / "a1" / WEIGHTS).read_bytes()
