"""Canary, approval and pruning: against the real backend and database.

The canary's live events are made in the synthetic world of `synthetic.py`, logged under the
mixture the backend serves (so their propensities are the mixture's), and posted over HTTP.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import numpy as np
import pytest

from backend.cli import backend_main
from backend.policy.canary import settle_canary
from backend.policy.loop import run_training
from backend.policy.registry import PolicyRegistry, RegistryError
from backend.policy.settings import TrainerSettings
from backend.policy_cli import policy_main
from backend.storage import Storage
from completion.gate import CanaryPolicy, Policy, builtin_policy, from_artifact, to_artifact
from evaluation.replay import wrong_sign
from telemetry.events import parse_event
from tests.backend.policy.synthetic import Logger, contexts, to_events
from tests.backend.policy.test_registry import get_policy, post_events
from tests.support.backend_server import BackendServer

SETTINGS = TrainerSettings(min_events=100, canary_min_decisions=300)


def _canary(candidate: Policy, previous: Policy, share: float) -> CanaryPolicy:
    return CanaryPolicy(
        candidate.version,
        candidate.space,
        candidate.normaliser,
        candidate.weights,
        candidate.show_floor,
        dict(candidate.metadata),
        previous=previous,
        share=share,
    )


def test_canary_acts_with_the_mixture_and_travels_whole() -> None:
    previous = builtin_policy()
    candidate = wrong_sign(previous, "v2")
    mixture = _canary(candidate, previous, 0.1)
    rows = contexts(300, seed=5)
    expected = 0.1 * candidate.p_show_batch(rows) + 0.9 * previous.p_show_batch(rows)
    assert mixture.p_show_batch(rows) == pytest.approx(expected)
    # The two disagree: the mixture is neither of them.
    assert not np.allclose(candidate.p_show_batch(rows), previous.p_show_batch(rows))
    loaded = from_artifact(to_artifact(mixture))
    assert isinstance(loaded, CanaryPolicy) and loaded.share == 0.1
    assert loaded.p_show_batch(rows) == pytest.approx(expected)
    # The propensity logged is the mixture's probability of the action taken.
    logged = Logger(mixture, seed=2).log(rows)
    p = mixture.p_show_batch(rows)
    for decision, p_show in zip(logged, p, strict=True):
        want = p_show if decision.shown else 1.0 - p_show
        if p_show > 0:
            assert decision.propensity == pytest.approx(want)
    # An editor's exploration floor applies to both halves.
    floored = mixture.with_floor(0.5)
    assert isinstance(floored, CanaryPolicy) and floored.previous is not None
    assert floored.previous.show_floor == 0.5


def _live(backend: BackendServer, policy: Policy, n: int, seed: int) -> None:
    """`n` decisions made by what the backend serves now, posted as a client would."""
    start = datetime.now(UTC) + timedelta(seconds=1)  # after the canary started
    logged = Logger(policy, seed=seed).log(contexts(n, seed=seed), start=start)
    post_events(backend, to_events(logged))


def test_a_worse_canary_is_rolled_back_and_a_good_one_serves(backend: BackendServer) -> None:
    registry = PolicyRegistry(backend.storage)
    tenant = backend.tenant_id
    base = registry.add(tenant, builtin_policy().derive, {"promote": True})
    registry.promote(tenant, base.version, actor="test")
    bad = registry.add(tenant, lambda v: wrong_sign(base, v), {"drill": True})
    registry.start_canary(tenant, bad.version, share=0.5, actor="test")
    served = get_policy(backend)
    assert served.headers["x-tabloop-policy-version"] == bad.version
    mixture = from_artifact(served.content)
    assert isinstance(mixture, CanaryPolicy) and mixture.share == 0.5
    assert registry.serving_version(tenant) == base.version  # still the one serving alone

    # Too few live decisions: it waits, and no candidate is trained meanwhile.
    _live(backend, mixture, 100, seed=11)
    waiting = run_training(backend.storage, tenant, SETTINGS)
    assert waiting.canary is not None and waiting.canary["outcome"] == "wait"
    assert waiting.candidate is None

    _live(backend, mixture, 1500, seed=12)
    verdict = settle_canary(registry, backend.storage, tenant, SETTINGS)
    assert verdict is not None and verdict["outcome"] == "rollback", verdict
    assert verdict["gain"] + 1.64 * verdict["gain_stderr"] < 0
    assert registry.canary(tenant) is None
    assert registry.serving_version(tenant) == base.version
    states = {r.version: r.state for r in registry.versions(tenant)}
    assert states == {base.version: "serving", bad.version: "rolled-back"}
    last = registry.history(tenant)[-1]
    assert last["action"] == "canary-rollback" and last["actor"] == "canary"
    assert last["figures"]["decisions"] >= 1500 and last["figures"]["gain"] < 0
    assert get_policy(backend).headers["x-tabloop-policy-version"] == base.version

    # A canary that acts exactly like the serving version is not worse: it takes all traffic.
    same = registry.add(tenant, base.derive, {"copy": True})
    registry.start_canary(tenant, same.version, share=0.1, actor="dashboard-user")
    _live(backend, from_artifact(get_policy(backend).content), 400, seed=13)
    verdict = settle_canary(registry, backend.storage, tenant, SETTINGS)
    assert verdict is not None and verdict["outcome"] == "promote", verdict
    assert registry.serving_version(tenant) == same.version
    actions = [h["action"] for h in registry.history(tenant)]
    assert actions == ["promote", "canary", "canary-rollback", "canary", "canary-promote"]
    assert registry.history(tenant)[3]["actor"] == "dashboard-user"


def test_approval_holds_a_passing_candidate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'backend.sqlite3'}"
    assert backend_main(["tenant", "set", "acme", "--require-approval", "--db", url]) == 0
    storage = Storage(url)
    try:
        tenant = storage.ensure_tenant("acme")
        assert storage.requires_approval(tenant)
        registry = PolicyRegistry(storage)
        start = datetime.now(UTC) - timedelta(hours=1)
        logged = Logger(builtin_policy(), seed=4).log(contexts(2500, seed=3), start=start)
        storage.insert_events(tenant, [parse_event(e) for e in to_events(logged)])
        summary = run_training(storage, tenant, TrainerSettings(min_events=100))
        assert summary.report["promote"], summary.report
        assert summary.state == "pending-approval" and not summary.promoted
        assert registry.serving_version(tenant) == "builtin"
        assert registry.pending_approval(tenant) == [summary.candidate]
        states = {r.version: r.state for r in registry.versions(tenant)}
        assert states == {summary.candidate: "pending-approval"}
        with pytest.raises(RegistryError):
            registry.approve(tenant, "v99", share=0.1)
    finally:
        storage.close()
    assert policy_main(["approve", str(summary.candidate), "--tenant", "acme", "--db", url]) == 0
    storage = Storage(url)
    try:
        registry = PolicyRegistry(storage)
        canary = registry.canary(tenant)
        assert canary is not None and canary.version == summary.candidate
        assert canary.share == TrainerSettings().canary_share
        assert registry.pending_approval(tenant) == []
        assert [h["action"] for h in registry.history(tenant)] == [
            "pending-approval",
            "approve",
            "canary",
        ]
        storage.set_require_approval("acme", False)
        assert not storage.requires_approval(tenant)
    finally:
        storage.close()


def test_pruning_keeps_promoted_and_the_newest_candidates(sqlite_backend: BackendServer) -> None:
    registry = PolicyRegistry(sqlite_backend.storage)
    tenant = sqlite_backend.tenant_id
    versions = [registry.add(tenant, builtin_policy().derive, {}).version for _ in range(12)]
    registry.promote(tenant, "v2", actor="test")
    registry.promote(tenant, "v3", actor="test")
    registry.rollback(tenant, actor="test")  # v3 rolled back: it served once, so it stays
    registry.hold_for_approval(tenant, "v5", actor="test")
    registry.start_canary(tenant, "v6", share=0.1, actor="test")
    deleted = registry.prune(tenant, keep=3)
    assert sorted(deleted, key=lambda v: int(v[1:])) == ["v1", "v4", "v7", "v8", "v9"]
    kept = [r.version for r in registry.versions(tenant)]
    assert kept == ["v2", "v3", "v5", "v6", "v10", "v11", "v12"]
    assert set(kept) | set(deleted) == set(versions)
    assert registry.prune(tenant, keep=3) == []  # nothing more to delete
    assert registry.canary(tenant) is not None  # the canary still runs
    assert (
        httpx.get(
            f"{sqlite_backend.url}/v1/policy",
            headers={"Authorization": f"Bearer {sqlite_backend.token}"},
            timeout=10,
        ).headers["x-tabloop-policy-version"]
        == "v6"
    )
