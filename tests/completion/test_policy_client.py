"""The policy client hot-swaps promoted versions and keeps serving through failures."""

from __future__ import annotations

import time
from pathlib import Path

from backend.policy.models import PolicyVersionRow
from backend.policy.registry import PolicyRegistry
from completion.gate import ShowWeights, builtin_policy
from completion.policy_client import CACHE_FILE, PolicyClient
from tests.support.backend_server import BackendServer, sqlite_backend

# A fixture by import: the backend tests' conftest does not reach tests/completion.
__all__ = ["sqlite_backend"]


def _client(backend: BackendServer, cache: Path, refresh_s: float = 60.0) -> PolicyClient:
    return PolicyClient(backend.url, backend.token, cache, refresh_s)


def _promote_new(backend: BackendServer, bias: float) -> str:
    registry = PolicyRegistry(backend.storage)

    def make(version: str):
        policy = builtin_policy()
        weight = policy.weights.linear_weight[0]
        return policy.derive(version, weights=ShowWeights.logistic(weight, bias))

    version = registry.add(backend.tenant_id, make, {}).version
    registry.promote(backend.tenant_id, version, actor="test")
    return version


def test_hot_swaps_a_newly_promoted_version(sqlite_backend: BackendServer, tmp_path: Path) -> None:
    client = _client(sqlite_backend, tmp_path)
    try:
        assert client.current().version == "builtin"
        assert not client.refresh_now()  # the backend serves the builtin too: nothing to swap
        held = client.current()
        version = _promote_new(sqlite_backend, bias=1.0)
        assert client.refresh_now()
        assert client.current().version == version
        assert held.version == "builtin"  # a reader holding the old policy keeps a whole one
        assert not client.refresh_now()  # 304 now
        assert sqlite_backend.storage.summary(sqlite_backend.tenant_id)["events"] == 0
    finally:
        client.close()


def test_background_polling_picks_up_a_promotion(
    sqlite_backend: BackendServer, tmp_path: Path
) -> None:
    client = _client(sqlite_backend, tmp_path, refresh_s=0.2)
    client.start()
    try:
        version = _promote_new(sqlite_backend, bias=2.0)
        deadline = time.monotonic() + 20
        while client.current().version != version and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.current().version == version
    finally:
        client.close()


def test_keeps_serving_when_the_backend_is_unreachable(
    sqlite_backend: BackendServer, tmp_path: Path
) -> None:
    client = _client(sqlite_backend, tmp_path)
    try:
        version = _promote_new(sqlite_backend, bias=1.0)
        assert client.refresh_now()
        sqlite_backend.stop_serving()
        assert not client.refresh_now()
        assert client.last_error is not None
        assert client.current().version == version
    finally:
        client.close()
    # A restart without any backend serves the cached version at once.
    offline = PolicyClient(None, None, tmp_path, 60.0)
    assert offline.current().version == version
    offline.close()


def test_keeps_serving_when_the_served_policy_is_corrupt(
    sqlite_backend: BackendServer, tmp_path: Path
) -> None:
    client = _client(sqlite_backend, tmp_path)
    try:
        good = _promote_new(sqlite_backend, bias=1.0)
        assert client.refresh_now()
        bad = _promote_new(sqlite_backend, bias=3.0)
        _tamper(sqlite_backend, bad)
        assert not client.refresh_now()
        assert "PolicyError" in (client.last_error or "")
        assert client.current().version == good
    finally:
        client.close()


def _tamper(backend: BackendServer, version: str) -> None:
    """Change the stored artefact's content but not its checksum (valid JSON, wrong sum)."""
    with backend.storage.session() as session:
        row = session.query(PolicyVersionRow).filter_by(version=version).one()
        row.artifact = row.artifact.replace('"show_floor": 0.05', '"show_floor": 0.5')
        session.commit()


def test_a_corrupt_cache_falls_back_to_the_builtin(tmp_path: Path) -> None:
    (tmp_path / CACHE_FILE).write_text('{"format": "tabloop.policy/1", "version": "v9"}')
    client = PolicyClient(None, None, tmp_path, 60.0)
    assert client.current().version == "builtin"
    assert not client.refresh_now()  # no backend configured: nothing to ask
    client.close()


def test_the_editor_floor_applies_to_fetched_policies(
    sqlite_backend: BackendServer, tmp_path: Path
) -> None:
    client = PolicyClient(sqlite_backend.url, sqlite_backend.token, tmp_path, 60.0, show_floor=0.2)
    try:
        _promote_new(sqlite_backend, bias=-40.0)
        assert client.refresh_now()
        assert client.current().show_floor == 0.2
    finally:
        client.close()
