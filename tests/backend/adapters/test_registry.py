"""The tenants' adapter registry in the database and its blob store, on SQLite and PostgreSQL:
the file registry's transitions and refusals, copies per cache directory, damaged blobs."""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.adapters.blobs import BlobError, BlobStore
from backend.adapters.registry import TenantAdapterRegistry, TenantAdapters
from backend.storage import Storage
from completion.adapters import MANIFEST, WEIGHTS
from tests.support.fake_adapter import FAKE_BASE_MODEL, fake_adapter
from training.registry import AdapterRegistry, AdapterRegistryError, AdapterVersions, scope_dir

GAIN = {
    "against": None,
    "exact_line_difference": {"mean": 0.12, "ci95_low": 0.04, "ci95_high": 0.2},
    "edit_similarity_difference": {"mean": 0.05, "ci95_low": 0.02, "ci95_high": 0.08},
}


@pytest.fixture
def storage(db_url: str) -> Iterator[Storage]:
    storage = Storage(db_url)
    yield storage
    storage.close()


@pytest.fixture
def tenant() -> str:
    """A tenant of its own (the PostgreSQL database is the session's)."""
    return f"acme-{uuid.uuid4().hex[:8]}"


def _registry(storage: Storage, tmp_path: Path, cache: str, tenant: str) -> TenantAdapterRegistry:
    storage.ensure_tenant(tenant)
    return TenantAdapters.open(storage, tmp_path / cache, str(tmp_path / "blobs")).registry(tenant)


def _blob(tmp_path: Path, checksum: str) -> Path:
    return tmp_path / "blobs" / "sha256" / checksum[:2] / checksum


def test_promotion_semantics_are_the_file_registrys(
    storage: Storage, tmp_path: Path, tenant: str
) -> None:
    registry: AdapterVersions = _registry(storage, tmp_path, "cache", tenant)
    first = registry.add(fake_adapter(tmp_path / "a1", 1), FAKE_BASE_MODEL, {"seed": 0})
    second = registry.add(fake_adapter(tmp_path / "a2", 2), FAKE_BASE_MODEL, {})
    assert (first.version, second.version) == (1, 2)
    with pytest.raises(AdapterRegistryError, match="not been evaluated"):
        registry.promote(1)
    registry.record_evaluation(1, {**GAIN, "against": 7})
    with pytest.raises(AdapterRegistryError, match="evaluate it again"):
        registry.promote(1)
    registry.record_evaluation(1, {**GAIN, "exact_line_difference": {"ci95_low": -0.1}})
    with pytest.raises(AdapterRegistryError, match="not promoting"):
        registry.promote(1)
    assert registry.get(1).status == "rejected"  # kept although the promotion was refused
    registry.record_evaluation(1, GAIN)
    assert "lower bound" in registry.promote(1)
    assert registry.serving() == 1 and registry.promote(1) == "v0001 serves already"

    assert "canary at 50%" in registry.promote(2, force=True, canary_share=0.5)
    with pytest.raises(AdapterRegistryError, match="canary v0002 is running"):
        registry.promote(1, force=True)
    with pytest.raises(AdapterRegistryError, match="not v0003"):
        registry.finish_canary(promote=True, version=3)
    arms = {registry.serving_for(f"install-{i}") for i in range(40)}
    assert arms == {1, 2}
    assert registry.rollback() == 1 and registry.canary() is None
    assert registry.get(2).status == "rolled-back"

    assert "waiting for approval" in registry.promote(2, force=True, hold=True)
    assert registry.pending() == [2] and registry.serving() == 1
    assert registry.approve(2) == "serving" and registry.serving() == 2
    with pytest.raises(AdapterRegistryError, match="not waiting"):
        registry.approve(2)
    assert registry.rollback() == 1 and registry.rollback() is None
    with pytest.raises(AdapterRegistryError, match="nothing to roll back"):
        registry.rollback()
    actions = [t["action"] for t in registry.transitions()]
    assert actions == [
        "promote",
        "canary",
        "canary-rollback",
        "pending-approval",
        "approve",
        "promote",
        "rollback",
        "rollback",
    ]
    assert registry.get(1).train == {"seed": 0}


def test_instances_with_their_own_caches_share_versions_and_refuse_damaged_blobs(
    storage: Storage, tmp_path: Path, tenant: str
) -> None:
    one = _registry(storage, tmp_path, "cache-one", tenant)
    other = _registry(storage, tmp_path, "cache-two", tenant)
    one.add(fake_adapter(tmp_path / "a1", 1), FAKE_BASE_MODEL, {})
    one.add(fake_adapter(tmp_path / "a2", 2), FAKE_BASE_MODEL, {})
    one.promote(1, force=True)
    assert other.serving() == 1
    copy = other.path(1)
    assert copy.parent == scope_dir(tmp_path / "cache-two", tenant=tenant)
    manifest = json.loads((copy / MANIFEST).read_text())
    assert manifest["version"] == "v0001"
    assert hashlib.sha256((copy / MANIFEST).read_bytes()).hexdigest() == one.files(1)[MANIFEST]

    # A copy changed locally is fetched again from the store.
    (copy / WEIGHTS).write_bytes(b"changed")
    assert (
        hashlib.sha256((other.path(1) / WEIGHTS).read_bytes()).hexdigest()
        == (manifest["files"][WEIGHTS])
    )

    # A blob changed in the store is refused where no good copy is held, and never copied.
    blob = _blob(tmp_path, one.files(2)[WEIGHTS])
    data = bytearray(blob.read_bytes())
    data[10] ^= 0x01
    blob.write_bytes(bytes(data))
    with pytest.raises(AdapterRegistryError, match=r"v0002 cannot be read: blob \w+ is damaged"):
        other.path(2)
    assert not (other.root / "v0002").exists()
    with pytest.raises(AdapterRegistryError, match="refusing a damaged adapter"):
        other.promote(2, force=True)
    assert one.serving() == 1


def test_concurrent_promotions_are_serialised(
    storage: Storage, tmp_path: Path, tenant: str
) -> None:
    registries = [_registry(storage, tmp_path, f"cache-{i}", tenant) for i in range(2)]
    for fill in (1, 2):
        registries[0].add(fake_adapter(tmp_path / f"a{fill}", fill), FAKE_BASE_MODEL, {})
    start = threading.Barrier(2)
    outcomes: list[str] = []

    def promote(registry: TenantAdapterRegistry, version: int) -> None:
        start.wait(timeout=10)
        try:
            outcomes.append(registry.promote(version, force=True, canary_share=0.2))
        except AdapterRegistryError as exc:
            outcomes.append(f"refused: {exc}")

    threads = [
        threading.Thread(target=promote, args=(registry, version))
        for registry, version in zip(registries, (1, 2), strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(o.startswith("refused: canary v000") for o in outcomes) == [False, True]
    canary = registries[1].canary()
    assert canary is not None and [t["action"] for t in registries[1].transitions()] == ["canary"]


def test_a_file_registry_is_copied_in_on_first_use(
    storage: Storage, tmp_path: Path, tenant: str
) -> None:
    cache = tmp_path / "cache"
    old = AdapterRegistry(scope_dir(cache, tenant=tenant))
    old.add(fake_adapter(tmp_path / "a1", 1), FAKE_BASE_MODEL, {"through_event_id": 9})
    old.add(fake_adapter(tmp_path / "a2", 2), FAKE_BASE_MODEL, {})
    old.promote(1, force=True)
    old.promote(2, force=True, canary_share=0.25)
    registry = _registry(storage, tmp_path, "cache", tenant)
    assert registry.serving() == 1
    canary = registry.canary()
    assert canary is not None and (canary.version, canary.share) == (2, 0.25)
    assert [t["action"] for t in registry.transitions()] == ["promote", "canary"]
    assert registry.get(1).train == {"through_event_id": 9}
    assert not (old.root / "registry.json").exists()
    other = _registry(storage, tmp_path, "elsewhere", tenant)
    assert (other.path(2) / WEIGHTS).read_bytes() == (old.root / "v0002" / WEIGHTS).read_bytes()


def test_blobs_are_named_by_their_checksum_and_checked(tmp_path: Path) -> None:
    store = BlobStore(f"memory://{tmp_path.name}/blobs")
    checksum = store.put_bytes(b"weights")
    assert checksum == hashlib.sha256(b"weights").hexdigest()
    assert store.read(checksum) == b"weights"
    store.fetch(checksum, tmp_path / "copy")
    assert (tmp_path / "copy").read_bytes() == b"weights"
    store.fs.pipe_file(f"{store.root}/sha256/{checksum[:2]}/{checksum}", b"weightz")
    with pytest.raises(BlobError, match=f"blob {checksum} is damaged"):
        store.fetch(checksum, tmp_path / "copy2")
    assert not (tmp_path / "copy2").exists()
    with pytest.raises(BlobError, match="is missing"):
        store.read("0" * 64)
    with pytest.raises(BlobError, match="not a blob name"):
        store.read("../etc/passwd")
