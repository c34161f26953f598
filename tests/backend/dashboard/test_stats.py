"""`/v1/stats/...` against the real backend on loopback, on SQLite and PostgreSQL: the figures
equal what the generated events say (recomputed in Python), the rollup and the live tail agree
wherever they split, tenants see only themselves, and registry actions record who acted."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backend.cli import backend_main
from backend.policy.registry import PolicyRegistry
from backend.services import stats_rollup as rollup_module
from backend.services.ingest import IngestLimits
from backend.services.stats import StatsService
from backend.services.stats_rollup import StatsRollup
from completion.gate import builtin_policy
from tabloop.cli import main as tabloop_main
from telemetry.events import parse_event
from tests.support import dashboard_history
from tests.support.backend_server import BackendServer
from tests.support.dashboard_history import History


@pytest.fixture
def seeded(db_url: str) -> Iterator[tuple[BackendServer, History]]:
    with BackendServer(db_url) as server:
        history = dashboard_history.generate(server.storage, server.tenant_id)
        dashboard_history.post(server.url, server.token, history.events)
        yield server, history


def get(server: BackendServer, path: str, token: str | None = None, **params: str) -> Any:
    response = httpx.get(
        f"{server.url}{path}",
        params=params,
        headers={"Authorization": f"Bearer {token or server.token}"},
        timeout=30,
    )
    return response


def test_overview_equals_the_events(seeded: tuple[BackendServer, History]) -> None:
    server, history = seeded
    for window in ("1h", "24h", "7d"):
        doc = get(server, "/v1/stats/overview", window=window).json()
        expected = dashboard_history.expected_summary(history.events, doc["start"], doc["end"])
        summary = doc["summary"]
        assert summary["requests"] == expected["requests"], window
        assert summary["shown"] == expected["shown"]
        assert summary["shown_share"] == pytest.approx(expected["shown_share"])
        assert summary["accept_rate"] == pytest.approx(expected["accept_rate"])
        assert summary["partial_rate"] == pytest.approx(expected["partial_rate"])
        assert summary["accepted_chars"] == expected["accepted_chars"]
        assert summary["retained_chars"]["600"] == expected["retained_600"]
        assert {k: v for k, v in summary["silences"].items() if k != "unknown"} == expected[
            "silences"
        ]
        assert summary["silences"]["unknown"] == 0
        # The series add up to the totals, slot by slot.
        assert sum(v or 0 for v in doc["series"]["requests"]) == expected["requests"]
    doc = get(server, "/v1/stats/overview", window="24h").json()
    assert doc["serving"] == "v1"
    assert [(m["action"], m["version"], m["actor"]) for m in doc["markers"]] == [
        ("promote", "v1", "token:alice"),
        ("promote", "v2", "trainer"),
        ("rollback", "v1", "token:bob"),
    ]
    assert [band["version"] for band in doc["bands"]] == ["builtin", "v1", "v2", "v1"]
    latency = doc["summary"]["latency_ms"]
    assert 10 <= latency["p50"] <= latency["p95"] <= 2000


def test_split_by_language_and_editor_adds_up(seeded: tuple[BackendServer, History]) -> None:
    server, history = seeded
    decisions = [e for e in history.events if e["type"] == "decision"]
    for by, key in (("language", "language"), ("editor", "client_name")):
        doc = get(server, f"/v1/stats/by/{by}", window="24h").json()
        counted = {row["value"]: row["requests"] for row in doc["rows"]}
        expected: dict[str, int] = {}
        for event in decisions:
            expected[event[key]] = expected.get(event[key], 0) + 1
        assert counted == expected
        assert sorted(doc["series"]["values"]) == sorted(expected)
    assert get(server, "/v1/stats/by/weather").status_code == 404


def test_the_rollup_and_the_live_tail_agree_wherever_they_split(
    seeded: tuple[BackendServer, History], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, _history = seeded
    registry = PolicyRegistry(server.storage)
    tenant = server.tenant_id
    # A fresh tenant copy of the same events, so this test controls its rollup from zero.
    other = server.storage.ensure_tenant(f"copy-{uuid.uuid4().hex[:6]}")
    rows = server.storage.events(tenant, limit=100_000)
    copies = [_copy(body) for _, body in rows]
    server.storage.insert_events(other, [parse_event(c) for c in copies])
    never_rolled = StatsRollup(server.storage, settle_s=1e9)
    never = StatsService(server.storage, registry, never_rolled)  # reads the tail only
    at_once = StatsRollup(server.storage, settle_s=0)
    # 24 h reads 5-minute rows, 7 and 30 days hourly ones, the split by editor all of them.
    windows = ("24h", "7d", "30d")
    now = time.time()  # one window for every read (some retention events lie ahead of now)
    live = {w: never.overview(other, w, now=now) for w in windows}
    live_split = never.split(other, "30d", "editor", now=now)
    assert never_rolled.watermark(other) == 0
    monkeypatch.setattr(rollup_module, "REFRESH_CHUNK", 97)  # an odd split, mid-decision
    at_once.refresh(other, max_events=300)
    assert 0 < never_rolled.watermark(other) < max(_ids(server, other))
    split = {w: never.overview(other, w, now=now) for w in windows}
    monkeypatch.setattr(rollup_module, "REFRESH_CHUNK", 500_000)
    at_once.refresh(other)
    rolled = {w: never.overview(other, w, now=now) for w in windows}
    for w in windows:
        assert split[w]["summary"] == live[w]["summary"], w
        assert rolled[w]["summary"] == live[w]["summary"], w
        assert rolled[w]["series"] == live[w]["series"], w
    assert never.split(other, "30d", "editor", now=now)["rows"] == live_split["rows"]
    assert live["24h"]["summary"]["requests"] > 0


def test_a_refresh_committed_between_the_watermark_and_the_read_counts_nothing_twice(
    seeded: tuple[BackendServer, History], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page's endpoints are read at once: one request's refresh returns a watermark, and
    another request's refresh commits a further range before the first request reads. The
    read must see the rollup and its live tail from the same watermark."""
    server, history = seeded
    registry = PolicyRegistry(server.storage)
    other = server.storage.ensure_tenant(f"race-{uuid.uuid4().hex[:6]}")
    rows = server.storage.events(server.tenant_id, limit=100_000)
    server.storage.insert_events(other, [parse_event(_copy(body)) for _, body in rows])
    lagging = StatsRollup(server.storage, settle_s=1e9)  # folds nothing, returns the watermark
    racing = StatsRollup(server.storage, settle_s=0)
    service = StatsService(server.storage, registry, lagging)
    now = time.time()
    before = service.overview(other, "24h", now=now)  # the live tail alone
    fold = lagging.refresh

    def another_request_refreshes_meanwhile(
        tenant_id: int, *, max_events: int | None = None
    ) -> int:
        watermark = fold(tenant_id, max_events=max_events)
        racing.refresh(tenant_id)
        return watermark

    monkeypatch.setattr(lagging, "refresh", another_request_refreshes_meanwhile)
    raced = service.overview(other, "24h", now=now)
    assert racing.watermark(other) == max(_ids(server, other))  # the range was rolled up
    assert raced["summary"] == before["summary"]
    assert raced["series"] == before["series"]
    expected = dashboard_history.expected_summary(history.events, raced["start"], raced["end"])
    assert raced["summary"]["requests"] == expected["requests"] > 0


def test_concurrent_refreshes_count_each_event_once(db_url: str) -> None:
    with BackendServer(db_url) as server:
        history = dashboard_history.generate(server.storage, server.tenant_id, requests_per_hour=5)
        dashboard_history.post(server.url, server.token, history.events)
        registry = PolicyRegistry(server.storage)
        rollups = [StatsRollup(server.storage, settle_s=0) for _ in range(4)]
        barrier = threading.Barrier(len(rollups))

        def refresh(rollup: StatsRollup) -> None:
            barrier.wait()
            rollup.refresh(server.tenant_id)

        threads = [threading.Thread(target=refresh, args=(r,)) for r in rollups]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        doc = StatsService(server.storage, registry, rollups[0]).overview(server.tenant_id, "24h")
        expected = dashboard_history.expected_summary(history.events, doc["start"], doc["end"])
        assert doc["summary"]["requests"] == expected["requests"]
        assert doc["summary"]["accepted_chars"] == expected["accepted_chars"]
        assert rollups[0].watermark(server.tenant_id) == max(_ids(server, server.tenant_id))


def test_an_empty_tenant_answers_empty_figures(backend: BackendServer) -> None:
    doc = get(backend, "/v1/stats/overview", window="30d").json()
    assert doc["empty"] is True
    assert doc["summary"]["requests"] == 0
    assert doc["summary"]["accept_rate"] is None
    assert doc["summary"]["latency_ms"]["p50"] is None
    assert doc["bands"] == [{"version": "builtin", "start": doc["start"], "end": doc["end"]}]
    assert get(backend, "/v1/stats/ingestion").json()["empty"] is True
    assert get(backend, "/v1/stats/policies").json()["versions"] == []
    assert get(backend, "/v1/stats/overview", window="2d").status_code == 422


def test_a_tenant_token_reads_only_its_tenant_and_an_admin_reads_all(
    backend: BackendServer,
) -> None:
    storage = backend.storage
    other = f"other-{uuid.uuid4().hex[:6]}"
    other_token = storage.create_token(other)
    admin = storage.create_token(f"ops-{uuid.uuid4().hex[:6]}", label="carol", admin=True)
    for path in ("/v1/stats/overview", "/v1/stats/policies", "/v1/stats/ingestion"):
        assert get(backend, path, tenant=other).status_code == 403
        assert get(backend, path, token=other_token, tenant=backend.tenant).status_code == 403
        assert get(backend, path, token=admin, tenant=other).status_code == 200
        assert get(backend, path, token=admin, tenant="no-such-tenant").status_code == 404
        # A tenant token cannot tell an absent tenant from another's.
        assert get(backend, path, tenant="no-such-tenant").status_code == 403
        assert get(backend, path, token="tl_wrong").status_code == 401
    assert get(backend, "/v1/stats/by/language", tenant=other).status_code == 403
    mine = get(backend, "/v1/stats/tenants").json()
    assert mine["tenants"] == [backend.tenant] and mine["admin"] is False
    everyone = get(backend, "/v1/stats/tenants", token=admin).json()
    assert {backend.tenant, other} <= set(everyone["tenants"])
    assert everyone["admin"] is True and everyone["label"] == "carol"


def test_registry_actions_change_the_registry_and_record_who_acted(
    seeded: tuple[BackendServer, History],
) -> None:
    server, history = seeded
    labelled = server.storage.create_token(server.tenant, label="dana")
    headers = {"Authorization": f"Bearer {labelled}"}
    v3 = history.versions[2]
    answer = httpx.post(
        f"{server.url}/v1/policy/promote", json={"version": v3}, headers=headers, timeout=10
    )
    assert answer.status_code == 200, answer.text
    dana = answer.json()["actor"]
    assert dana.startswith("token:dana#")
    assert answer.json() == {"tenant": server.tenant, "serving": v3, "actor": dana}
    registry = PolicyRegistry(server.storage)
    assert registry.serving_version(server.tenant_id) == v3
    assert registry.history(server.tenant_id)[-1]["actor"] == dana
    back = httpx.post(
        f"{server.url}/v1/policy/rollback", json={"version": v3}, headers=headers, timeout=10
    )
    assert back.status_code == 200 and back.json()["serving"] == "v1"
    assert registry.history(server.tenant_id)[-1]["action"] == "rollback"
    unknown = httpx.post(
        f"{server.url}/v1/policy/promote", json={"version": "v99"}, headers=headers, timeout=10
    )
    assert unknown.status_code == 409
    other = f"other-{uuid.uuid4().hex[:6]}"
    server.storage.create_token(other)
    foreign = httpx.post(
        f"{server.url}/v1/policy/rollback",
        json={"tenant": other, "version": "v1"},
        headers=headers,
        timeout=10,
    )
    assert foreign.status_code == 403
    assert registry.serving_version(server.tenant_id) == "v1"
    # A version waiting for approval is released by the approve action, and the history says who.
    registry.hold_for_approval(server.tenant_id, v3)
    approved = httpx.post(
        f"{server.url}/v1/policy/approve", json={"version": v3}, headers=headers, timeout=10
    )
    assert approved.status_code == 200, approved.text
    last = registry.history(server.tenant_id)[-1]
    assert last["version"] == v3 and last["actor"] == dana
    again = httpx.post(
        f"{server.url}/v1/policy/approve", json={"version": v3}, headers=headers, timeout=10
    )
    # A replay changes nothing; a version that never waited is refused.
    assert again.status_code == 200 and again.json()["serving"] == approved.json()["serving"]
    assert [row["action"] for row in registry.history(server.tenant_id)].count("approve") == 1
    never = httpx.post(
        f"{server.url}/v1/policy/approve",
        json={"version": history.versions[0]},
        headers=headers,
        timeout=10,
    )
    assert never.status_code == 409


def test_ingestion_counts_batches_refusals_and_spools(db_url: str) -> None:
    limits = IngestLimits(rate_events_per_s=0.001, burst_events=10, max_batch_events=10)
    with BackendServer(db_url, limits=limits) as server:
        history = dashboard_history.generate(server.storage, server.tenant_id, requests_per_hour=2)
        batch = history.events[:5]
        headers = {"Authorization": f"Bearer {server.token}"}
        meta = {"install_id": "laptop-1", "spool_backlog": 42, "spool_dropped": 7}
        url = f"{server.url}/v1/events"
        first = httpx.post(url, json={"events": batch, "meta": meta}, headers=headers)
        assert first.status_code == 200 and len(first.json()["accepted"]) == 5
        # A meta that is not one is ignored: the events are what matters.
        bad_meta = {"install_id": "x", "spool_backlog": -1, "spool_dropped": 0}
        again = httpx.post(url, json={"events": batch, "meta": bad_meta}, headers=headers)
        assert again.status_code == 200 and len(again.json()["duplicate"]) == 5
        limited = httpx.post(url, json={"events": history.events[5:7]}, headers=headers)
        assert limited.status_code == 429
        doc = get(server, "/v1/stats/ingestion", window="1h").json()
    totals = doc["totals"]
    assert totals["batches"] == 3
    assert totals["accepted"] == 5 and totals["duplicate"] == 5
    assert totals["duplicate_batches"] == 1
    assert totals["refused_batches"] == 1 and totals["rate_limited"] == 1
    assert sum(doc["series"]["rate_limited"]) == 1
    assert [(s["install_id"], s["backlog"], s["dropped"]) for s in doc["spools"]] == [
        ("laptop-1", 42, 7)
    ]


def test_token_create_with_label_and_admin(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    tenant = f"t-{uuid.uuid4().hex[:6]}"
    assert backend_main(["token", "create", "--tenant", tenant, "--label", "erin", "--admin",
                         "--db", db_url]) == 0  # fmt: skip
    token = capsys.readouterr().out.strip()
    with BackendServer(db_url) as server:
        principal = server.storage.principal_for_token(token)
        assert principal is not None
        assert (principal.tenant, principal.label, principal.admin) == (tenant, "erin", True)
        plain = server.storage.principal_for_token(server.token)
        assert plain is not None and plain.admin is False and plain.label is None
    assert backend_main(["token", "create", "--tenant", tenant, "--label", "two words",
                         "--db", db_url]) == 2  # fmt: skip
    assert "token label" in capsys.readouterr().err


def test_tabloop_stats_prints_the_overview(
    seeded: tuple[BackendServer, History], capsys: pytest.CaptureFixture[str]
) -> None:
    server, _history = seeded
    endpoint = get(server, "/v1/stats/overview", window="24h").json()
    argv = ["stats", "--db", server.db_url, "--tenant", server.tenant, "--window", "24h"]
    assert tabloop_main([*argv, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["summary"] == endpoint["summary"]
    assert tabloop_main(argv) == 0
    table = capsys.readouterr().out
    assert f"{endpoint['summary']['requests']:,}" in table
    assert "accepted (full)" in table and "latency p95" in table
    with pytest.raises(SystemExit, match="no tenant"):
        tabloop_main(["stats", "--db", server.db_url, "--tenant", "nobody-here"])


def _copy(body: dict[str, Any]) -> dict[str, Any]:
    return {**body, "event_id": str(uuid.uuid4())}


def _ids(server: BackendServer, tenant_id: int) -> list[int]:
    return [row_id for row_id, _ in server.storage.events(tenant_id, limit=100_000)]


def test_who_acted_names_the_token_whole_and_unambiguously(backend: BackendServer) -> None:
    storage = backend.storage
    registry = PolicyRegistry(storage)
    versions = [
        registry.add(backend.tenant_id, builtin_policy().derive, {}).version for _ in range(4)
    ]
    ops = f"ops-{uuid.uuid4().hex[:6]}"
    # An admin's label, reused by a tenant token; two labels of 64 that differ in the last one.
    tokens = [
        storage.create_token(ops, label="admin-ops", admin=True),
        storage.create_token(backend.tenant, label="admin-ops"),
        storage.create_token(backend.tenant, label="a" * 63 + "b"),
        storage.create_token(backend.tenant, label="a" * 63 + "c"),
    ]
    for token, version in zip(tokens, versions, strict=True):
        answer = httpx.post(
            f"{backend.url}/v1/policy/promote",
            json={"tenant": backend.tenant, "version": version},
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text
    actors = [row["actor"] for row in registry.history(backend.tenant_id)[-4:]]
    assert len(set(actors)) == 4, actors
    assert actors[2].startswith("token:" + "a" * 63 + "b#")
    assert actors[3].startswith("token:" + "a" * 63 + "c#")
    with pytest.raises(ValueError, match="1 to 64"):
        storage.create_token(backend.tenant, label="")
