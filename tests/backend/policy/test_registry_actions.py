"""Registry actions over HTTP on the real backend, on SQLite and PostgreSQL: actions name the
version they act on, replays change nothing, and concurrent actions on one tenant are serialised
so that every row of the history names the version that was serving when it was written."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from backend.policy.registry import BUILTIN_VERSION, PolicyRegistry
from completion.gate import builtin_policy
from tests.support.backend_server import BackendServer


def _versions(backend: BackendServer, count: int) -> list[str]:
    registry = PolicyRegistry(backend.storage)
    return [
        registry.add(backend.tenant_id, builtin_policy().derive, {}).version for _ in range(count)
    ]


def _act(backend: BackendServer, action: str, **body: Any) -> httpx.Response:
    return httpx.post(
        f"{backend.url}/v1/policy/{action}",
        json=body,
        headers={"Authorization": f"Bearer {backend.token}"},
        timeout=60,
    )


def _check_history(history: list[dict[str, Any]]) -> None:
    """Replays the history: each promotion names what served before it, each rollback the
    version it took away, which must be the one serving then."""
    serving, canary = BUILTIN_VERSION, None
    for row in history:
        figures = row["figures"] or {}
        if row["action"] == "rollback":
            assert figures["of"] == serving and canary is None, (row, serving)
            assert row["reason"] == f"rollback of {serving}"
            serving = row["version"]
        elif row["action"] == "canary-rollback":
            assert figures["of"] == canary and figures.get("of") is not None, (row, canary)
            serving, canary = row["version"], None
        elif row["action"] in ("promote", "canary-promote"):
            assert figures["previous"] == serving, (row, serving)
            serving, canary = row["version"], None
        elif row["action"] == "canary":
            assert figures["previous"] == serving, (row, serving)
            canary = row["version"]


def test_rollback_names_its_version_and_a_replay_changes_nothing(backend: BackendServer) -> None:
    v1, v2, v3 = _versions(backend, 3)
    for version in (v1, v2, v3):
        assert _act(backend, "promote", version=version).status_code == 200
    registry = PolicyRegistry(backend.storage)
    rows = len(registry.history(backend.tenant_id))
    # Promoting what serves already is a replay: no new row.
    assert _act(backend, "promote", version=v3).json()["serving"] == v3
    assert len(registry.history(backend.tenant_id)) == rows

    # A stale page that saw v2 serving cannot roll back v3.
    stale = _act(backend, "rollback", version=v2)
    assert stale.status_code == 409, stale.text
    assert registry.serving_version(backend.tenant_id) == v3
    assert _act(backend, "rollback").status_code == 422  # the version is required

    first = _act(backend, "rollback", version=v3)
    assert first.status_code == 200 and first.json()["serving"] == v2
    for _ in range(3):  # the same request again: v2 stays
        replay = _act(backend, "rollback", version=v3)
        assert replay.status_code == 200 and replay.json()["serving"] == v2
    assert registry.serving_version(backend.tenant_id) == v2
    assert len(registry.history(backend.tenant_id)) == rows + 1
    _check_history(registry.history(backend.tenant_id))


def test_concurrent_approvals_of_one_version_approve_it_once(backend: BackendServer) -> None:
    (version,) = _versions(backend, 1)
    registry = PolicyRegistry(backend.storage)
    registry.hold_for_approval(backend.tenant_id, version)
    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(lambda _: _act(backend, "approve", version=version), range(10)))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    actions = [row["action"] for row in registry.history(backend.tenant_id)]
    assert actions.count("approve") == 1 and actions.count("canary") == 1, actions
    assert registry.canary(backend.tenant_id) is not None
    # A version that never waited is refused.
    (other,) = _versions(backend, 1)
    assert _act(backend, "approve", version=other).status_code == 409


def test_fifty_concurrent_actions_leave_a_consistent_history(backend: BackendServer) -> None:
    versions = _versions(backend, 6)
    assert _act(backend, "promote", version=versions[0]).status_code == 200
    registry = PolicyRegistry(backend.storage)
    rng = random.Random(7)

    def one(i: int) -> int:
        kind = rng.choice(("promote", "rollback", "rollback"))
        if kind == "promote":
            return _act(backend, "promote", version=rng.choice(versions)).status_code
        # What a page showed a moment ago: often no longer what serves.
        seen = registry.serving_version(backend.tenant_id)
        return _act(backend, "rollback", version=seen).status_code

    with ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(one, range(50)))
    assert set(codes) <= {200, 409}, codes
    history = registry.history(backend.tenant_id)
    assert sum(row["action"] == "rollback" for row in history) >= 1
    _check_history(history)


@pytest.mark.parametrize("share", [pytest.param(0.0, id="straight-to-serving")])
def test_an_approved_replay_answers_what_the_version_became(
    backend: BackendServer, share: float
) -> None:
    (version,) = _versions(backend, 1)
    registry = PolicyRegistry(backend.storage)
    registry.hold_for_approval(backend.tenant_id, version)
    assert registry.approve(backend.tenant_id, version, share=share) == "serving"
    assert registry.approve(backend.tenant_id, version, share=share) == "serving"
    assert [row["action"] for row in registry.history(backend.tenant_id)].count("approve") == 1
