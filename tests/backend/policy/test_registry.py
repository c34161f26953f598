"""Registry, promotion and serving against the real backend on loopback."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest

from backend.policy.loop import run_training
from backend.policy.registry import PolicyRegistry, RegistryError
from backend.policy.settings import TrainerSettings
from completion.gate import builtin_policy, from_artifact
from tests.backend.policy.synthetic import Logger, contexts, to_events
from tests.support.backend_server import BackendServer

SETTINGS = TrainerSettings(min_events=100, canary_share=0.0)  # promotion serves at once


def post_events(backend: BackendServer, events: list[dict[str, object]]) -> None:
    headers = {"Authorization": f"Bearer {backend.token}"}
    for start in range(0, len(events), 500):
        response = httpx.post(
            f"{backend.url}/v1/events",
            json={"events": events[start : start + 500]},
            headers=headers,
            timeout=30,
        )
        response.raise_for_status()
        assert not response.json()["rejected"], response.json()["rejected"][:3]


def get_policy(backend: BackendServer, etag: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {backend.token}"}
    if etag:
        headers["If-None-Match"] = etag
    return httpx.get(f"{backend.url}/v1/policy", headers=headers, timeout=10)


def test_events_train_a_policy_that_is_promoted_and_served(backend: BackendServer) -> None:
    start = datetime.now(UTC) - timedelta(hours=1)
    logged = Logger(builtin_policy(), seed=4).log(contexts(2500, seed=3), start=start)
    post_events(backend, to_events(logged))

    first = get_policy(backend)
    assert first.status_code == 200
    assert first.headers["x-tabloop-policy-version"] == "builtin"

    summary = run_training(backend.storage, backend.tenant_id, SETTINGS)
    assert summary.events == len(logged)
    assert summary.promoted, summary.report
    assert summary.candidate == "v1"

    served = get_policy(backend, first.headers["etag"])
    assert served.status_code == 200
    policy = from_artifact(served.content)
    assert policy.version == "v1"
    assert policy.metadata["parent"] == "builtin"
    again = get_policy(backend, served.headers["etag"])
    assert again.status_code == 304
    assert again.content == b""

    listing = httpx.get(
        f"{backend.url}/v1/policy/versions",
        headers={"Authorization": f"Bearer {backend.token}"},
        timeout=10,
    ).json()
    assert listing["serving"] == "v1"
    assert [v["version"] for v in listing["versions"]] == ["v1"]


def test_policy_needs_a_token(sqlite_backend: BackendServer) -> None:
    assert httpx.get(f"{sqlite_backend.url}/v1/policy", timeout=10).status_code == 401


def _add(registry: PolicyRegistry, tenant: int) -> str:
    return registry.add(tenant, builtin_policy().derive, {"promote": True}).version


def test_rollback_restores_the_previous_version(backend: BackendServer) -> None:
    registry = PolicyRegistry(backend.storage)
    tenant = backend.tenant_id
    other = backend.storage.ensure_tenant("someone-else")
    v1, v2, v3 = (_add(registry, tenant) for _ in range(3))
    assert (v1, v2, v3) == ("v1", "v2", "v3")
    assert _add(registry, other) == "v1"  # numbering and serving are per tenant

    registry.promote(tenant, v1, actor="test")
    registry.promote(tenant, v3, actor="test")
    assert registry.serving_version(tenant) == v3
    assert registry.serving_version(other) == "builtin"

    assert registry.rollback(tenant, actor="test") == v1
    assert registry.serving_policy(tenant).version == v1
    assert get_policy(backend).headers["x-tabloop-policy-version"] == v1
    # v3 is marked: rolling back again does not bring it back.
    assert registry.rollback(tenant, actor="test") == "builtin"
    assert registry.serving_version(tenant) == "builtin"
    with pytest.raises(RegistryError):
        registry.rollback(tenant, actor="test")
    # An explicit promotion brings a rolled-back version back.
    registry.promote(tenant, v3, actor="test")
    assert registry.serving_version(tenant) == v3
    flags = {r.version: (r.serving, r.rolled_back) for r in registry.versions(tenant)}
    assert flags == {v1: (False, True), v2: (False, False), v3: (True, False)}
    assert [h["action"] for h in registry.history(tenant)] == [
        "promote",
        "promote",
        "rollback",
        "rollback",
        "promote",
    ]
    with pytest.raises(RegistryError):
        registry.promote(tenant, "v99", actor="test")


def test_too_few_events_train_nothing(sqlite_backend: BackendServer) -> None:
    start = datetime.now(UTC) - timedelta(hours=1)  # inside the backend's time window
    logged = Logger(builtin_policy(), seed=1).log(contexts(30, seed=1), start=start)
    post_events(sqlite_backend, to_events(logged))
    summary = run_training(sqlite_backend.storage, sqlite_backend.tenant_id, SETTINGS)
    assert summary.candidate is None and not summary.promoted
    assert "skipped" in summary.report
