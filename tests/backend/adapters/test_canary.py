"""The adapter canary of a tenant, against the real backend on loopback and its database: each
installation is answered one arm by `GET /v1/model`, decision events carry the model version,
and the training pass judges the canary on them (rolled back when worse, serving when not)."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend.adapters.canary import ModelCanaryJudge, settle_model_canary
from backend.adapters.registry import TenantAdapterRegistry
from backend.adapters.run import release_version, tenant_registry
from backend.policy.loop import TrainingScheduler
from backend.policy.settings import TrainerSettings
from completion.adapters import WEIGHTS
from tests.support.backend_server import BackendServer
from tests.support.fake_adapter import FAKE_BASE_MODEL, fake_adapter
from tests.support.model_events import shown
from training.canary import ModelCanarySettings, on_canary_arm
from training.registry import AdapterRegistryError

JUDGE = ModelCanarySettings(min_decisions=100, max_decisions=1000)
# No policy is trained in these passes: only the adapter canary is judged.
NO_POLICY = TrainerSettings(min_events=1_000_000)


@pytest.fixture
def canaried(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[BackendServer, TenantAdapterRegistry]]:
    """A tenant whose v0001 serves and whose v0002 is a canary at half of its clients."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("TABLOOP_CACHE_DIR", str(cache))
    with BackendServer(db_url) as backend:
        registry = tenant_registry(backend.storage, cache, backend.tenant)
        first = registry.add(fake_adapter(tmp_path / "a1", 1), FAKE_BASE_MODEL, {})
        second = registry.add(fake_adapter(tmp_path / "a2", 2), FAKE_BASE_MODEL, {})
        registry.promote(first.version, force=True)
        registry.promote(second.version, force=True, canary_share=0.5)
        yield backend, registry


def _get(backend: BackendServer, path: str, **params: str) -> httpx.Response:
    return httpx.get(
        backend.url + path,
        params=params,
        headers={"Authorization": f"Bearer {backend.token}"},
        timeout=30,
    )


def test_each_installation_is_answered_one_arm(
    canaried: tuple[BackendServer, TenantAdapterRegistry],
) -> None:
    backend, registry = canaried
    canary = registry.canary()
    assert canary is not None and canary.version == 2 and canary.previous == 1
    arms: dict[str, list[str]] = {"canary": [], "serving": []}
    for n in range(40):
        install = f"install-{n}"
        body = _get(backend, "/v1/model", install_id=install).json()
        expected = on_canary_arm(install, 2, 0.5)
        assert body["version"] == ("v0002" if expected else "v0001")
        assert body["arm"] == ("canary" if expected else "serving")
        arms[body["arm"]].append(install)
        # The files answered are those of the client's arm, and the same on every request.
        weights = _get(backend, f"/v1/model/files/{WEIGHTS}", install_id=install)
        assert hashlib.sha256(weights.content).hexdigest() == body["files"][WEIGHTS]
        assert _get(backend, "/v1/model", install_id=install).json() == body
    assert arms["canary"] and arms["serving"]
    # Without an installation's id the serving version is answered.
    assert _get(backend, "/v1/model").json()["version"] == "v0001"
    assert _get(backend, "/v1/model", install_id="bad id!").status_code == 422


def _events(
    model_version: str | None, accepted: int, ignored: int, *, start: datetime
) -> list[dict[str, Any]]:
    """Shown decisions of one arm with their outcomes, accepted ones fully retained."""
    events: list[dict[str, Any]] = []
    for n in range(accepted + ignored):
        kind = "accepted" if n < accepted else "ignored"
        events += shown(model_version, kind, start + timedelta(seconds=n), retained=True)
    return events


def _post(backend: BackendServer, events: list[dict[str, Any]]) -> None:
    for start in range(0, len(events), 500):
        batch = events[start : start + 500]
        answer = httpx.post(
            backend.url + "/v1/events",
            content=gzip.compress(json.dumps({"events": batch}).encode()),
            headers={
                "Authorization": f"Bearer {backend.token}",
                "Content-Type": "application/json",
                "Content-Encoding": "gzip",
            },
            timeout=30,
        )
        answer.raise_for_status()
        assert len(answer.json()["accepted"]) == len(batch), answer.text


def _pass(backend: BackendServer) -> dict[str, Any] | None:
    """One training pass of the backend with the adapter canary judged; this tenant's verdict."""
    judge = ModelCanaryJudge(backend.storage, backend.services.cache_dir, JUDGE, NO_POLICY)
    scheduler = TrainingScheduler(backend.storage, NO_POLICY, model_canary=judge)
    runs = {run.tenant_id: run for run in scheduler.run_once()}
    return runs[backend.tenant_id].model_canary


def test_a_bad_adapter_is_rolled_back_by_its_canary(
    canaried: tuple[BackendServer, TenantAdapterRegistry],
) -> None:
    backend, registry = canaried
    start = datetime.now(UTC) + timedelta(seconds=2)  # after the canary started
    # The canary's suggestions are ignored far more often than the serving version's.
    _post(backend, _events("v0002", 15, 135, start=start))
    _post(backend, _events("v0001", 90, 60, start=start))
    verdict = _pass(backend)
    assert verdict is not None and verdict["outcome"] == "rollback", verdict
    assert verdict["gain"] < 0 and verdict["canary_decisions"] == 150
    assert registry.canary() is None and registry.serving() == 1
    assert registry.get(2).status == "rolled-back"
    last = registry.transitions()[-1]
    assert last["action"] == "canary-rollback" and last["actor"] == "canary"
    assert last["version"] == "v0001" and last["figures"]["of"] == "v0002"
    assert _get(backend, "/v1/model", install_id="anyone").json()["version"] == "v0001"


def test_a_good_adapter_serves_alone_after_its_canary(
    canaried: tuple[BackendServer, TenantAdapterRegistry],
) -> None:
    backend, registry = canaried
    start = datetime.now(UTC) + timedelta(seconds=2)
    _post(backend, _events("v0002", 105, 45, start=start))
    _post(backend, _events("v0001", 75, 75, start=start))
    verdict = _pass(backend)
    assert verdict is not None and verdict["outcome"] == "promote", verdict
    assert registry.canary() is None and registry.serving() == 2
    assert registry.transitions()[-1]["action"] == "canary-promote"
    for n in range(10):
        assert _get(backend, "/v1/model", install_id=f"i{n}").json()["version"] == "v0002"


def test_events_without_a_model_version_are_accepted_and_judge_nothing(
    canaried: tuple[BackendServer, TenantAdapterRegistry],
) -> None:
    backend, registry = canaried
    start = datetime.now(UTC) + timedelta(seconds=2)
    old_client = _events(None, 10, 200, start=start)  # as a client before model_version sends
    assert all("model_version" not in e for e in old_client if e["type"] == "decision")
    _post(backend, old_client)
    verdict = _pass(backend)
    assert verdict is not None and verdict["outcome"] == "wait"
    assert verdict["canary_decisions"] == 0 and verdict["serving_decisions"] == 0
    assert registry.canary() is not None


def test_decisions_before_the_canary_started_judge_nothing(
    canaried: tuple[BackendServer, TenantAdapterRegistry],
) -> None:
    backend, _registry = canaried
    before = datetime.now(UTC) - timedelta(hours=1)
    _post(backend, _events("v0002", 0, 150, start=before))
    _post(backend, _events("v0001", 150, 0, start=before))
    verdict = settle_model_canary(
        backend.storage,
        backend.tenant_id,
        backend.tenant,
        backend.services.cache_dir,
        JUDGE,
        NO_POLICY,
    )
    assert verdict is not None and verdict["outcome"] == "wait"
    assert verdict["canary_decisions"] == 0


def test_a_tenant_that_requires_approval_gets_a_pending_promotion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("TABLOOP_CACHE_DIR", str(cache))
    with BackendServer(f"sqlite:///{tmp_path / 'db.sqlite3'}") as backend:
        registry = tenant_registry(backend.storage, cache, backend.tenant)
        record = registry.add(fake_adapter(tmp_path / "a1", 1), FAKE_BASE_MODEL, {})
        backend.storage.set_require_approval(backend.tenant, True)
        reason = release_version(
            registry, backend.storage, backend.tenant_id, record.version, 0.1, "trainer", force=True
        )
        assert "waiting for approval" in reason
        assert registry.pending() == [1] and registry.serving() is None
        assert registry.canary() is None
        assert _get(backend, "/v1/model", install_id="i").json()["version"] is None
        assert registry.approve(1, canary_share=0.1) == "canary"
        assert registry.pending() == [] and registry.canary() is not None
        with pytest.raises(AdapterRegistryError, match="not waiting"):
            registry.approve(1)
        backend.storage.set_require_approval(backend.tenant, False)
        second = registry.add(fake_adapter(tmp_path / "a2", 2), FAKE_BASE_MODEL, {})
        with pytest.raises(AdapterRegistryError, match="canary v0001 is running"):
            release_version(
                registry, backend.storage, backend.tenant_id, second.version, 0.1, "t", force=True
            )
