"""`POST /v1/events` against the real backend on loopback, on SQLite and PostgreSQL."""

from __future__ import annotations

import gzip
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from backend.services.ingest import IngestLimits, TimeWindow, admit_valid
from telemetry.events import (
    DecisionEvent,
    NextEditEvent,
    OutcomeEvent,
    RetentionEvent,
    parse_event,
)
from tests.support.backend_server import BackendServer


def decision(**over: Any) -> dict[str, Any]:
    event = DecisionEvent(
        decision_id=uuid.uuid4().hex,
        session_id="s1",
        install_id="i1",
        language="python",
        trigger="automatic",
        policy_version="builtin",
        model_id="Qwen/Qwen2.5-Coder-0.5B",
        action="show",
        propensity=0.8,
        features={"prefix_len": 12.0, "lang": "python"},
        suggestion_chars=10,
        suggestion_lines=1,
    )
    return {**event.model_dump(mode="json"), **over}


def outcome(kind: str = "accepted", **over: Any) -> dict[str, Any]:
    chars = 10 if kind in ("accepted", "partial") else None
    event = OutcomeEvent(decision_id=uuid.uuid4().hex, kind=kind, accepted_chars=chars)  # type: ignore[arg-type]
    return {**event.model_dump(mode="json"), **over}


def post(
    backend: BackendServer,
    body: bytes,
    *,
    token: str | None = None,
    gzipped: bool = True,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    sent = {
        "Authorization": f"Bearer {backend.token if token is None else token}",
        "Content-Type": "application/json",
        **({"Content-Encoding": "gzip"} if gzipped else {}),
        **(headers or {}),
    }
    return httpx.post(
        backend.url + "/v1/events",
        content=gzip.compress(body) if gzipped else body,
        headers=sent,
        timeout=30,
    )


def batch(*events: dict[str, Any]) -> bytes:
    return json.dumps({"events": list(events)}).encode()


def test_round_trip_is_idempotent(backend: BackendServer) -> None:
    events = [decision(), outcome("partial"), outcome("ignored", reason="timeout")]
    ids = [e["event_id"] for e in events]
    first = post(backend, batch(*events))
    assert first.status_code == 200, first.text
    assert first.json() == {"accepted": ids, "duplicate": [], "rejected": []}
    again = post(backend, batch(*events, events[0]))
    assert again.json() == {"accepted": [], "duplicate": [*ids, ids[0]], "rejected": []}
    assert sorted(backend.stored_ids()) == sorted(ids)
    assert backend.summary() == {
        "events": 3,
        "decisions": {"show": 1},
        "outcomes": {"partial": 1, "ignored": 1},
        "retention": 0,
        "next_edits": {},
    }
    assert backend.metrics.value("tabloop_events_ingested_total", type="outcome") == 2
    assert backend.metrics.value("tabloop_events_duplicate_total") == 4


def next_edit(kind: str = "shown", **over: Any) -> dict[str, Any]:
    event = NextEditEvent(
        decision_id=uuid.uuid4().hex,
        session_id="s1",
        install_id="i1",
        kind=kind,
        reason="typed" if kind == "rejected" else None,
        language="python",
        trigger="automatic",
        model_id="Qwen/Qwen2.5-Coder-0.5B",
        edits=2,
        removed_chars=5,
        inserted_chars=1,
        window_lines=21,
    )
    return {**event.model_dump(mode="json"), **over}


def test_next_edit_events_are_stored_apart_from_decisions(backend: BackendServer) -> None:
    events = [next_edit("shown"), next_edit("accepted"), next_edit("rejected")]
    answer = post(backend, batch(*events)).json()
    assert answer["accepted"] == [e["event_id"] for e in events] and not answer["rejected"]
    summary = backend.summary()
    assert summary["next_edits"] == {"shown": 1, "accepted": 1, "rejected": 1}
    assert summary["decisions"] == {} and summary["retention"] == 0
    refused = post(backend, batch(next_edit("rejected", reason=None))).json()["rejected"]
    assert refused and "reason" in refused[0]["error"]


def test_same_id_twice_in_one_batch_is_stored_once(backend: BackendServer) -> None:
    event = outcome()
    answer = post(backend, batch(event, event)).json()
    assert answer["accepted"] == [event["event_id"]]
    assert answer["duplicate"] == [event["event_id"]]
    assert backend.stored_ids() == [event["event_id"]]


@pytest.mark.parametrize(
    ("mutate", "error"),
    [
        pytest.param(lambda e: {**e, "surprise": 1}, "Extra inputs", id="unknown-field"),
        pytest.param(lambda e: {**e, "type": "gossip"}, "tag", id="unknown-type"),
        pytest.param(lambda e: {**e, "propensity": 1.5}, "propensity", id="propensity-range"),
        pytest.param(lambda e: {**e, "action": "shout"}, "action", id="bad-action"),
        pytest.param(
            lambda e: {**e, "features": {"x": "Has Spaces"}}, "features", id="feature-not-category"
        ),
        pytest.param(lambda e: {**e, "schema_version": 3}, "schema_version", id="future-schema"),
        pytest.param(lambda e: "not an object", "", id="not-an-object"),
        pytest.param(
            lambda e: {**e, "silence_reason": "latency"}, "silence_reason", id="reason-on-show"
        ),
        pytest.param(lambda e: {**e, "rank": 3, "candidates": 3}, "rank", id="rank-past-count"),
        pytest.param(lambda e: {**e, "event_id": "nope"}, "event_id", id="bad-event-id"),
    ],
)
def test_invalid_events_are_rejected_alone(backend: BackendServer, mutate: Any, error: str) -> None:
    good = outcome()
    bad = mutate(decision())
    answer = post(backend, batch(good, bad)).json()
    assert answer["accepted"] == [good["event_id"]]
    assert len(answer["rejected"]) == 1
    assert answer["rejected"][0]["index"] == 1
    assert error in answer["rejected"][0]["error"]
    assert backend.stored_ids() == [good["event_id"]]


@pytest.mark.parametrize(
    ("kind", "fields", "ok"),
    [
        pytest.param("partial", {"accepted_chars": None}, False, id="partial-needs-chars"),
        pytest.param("ignored", {"accepted_chars": 3}, False, id="ignored-takes-no-chars"),
        pytest.param("dismissed", {"reason": "timeout"}, False, id="reason-only-for-ignored"),
        pytest.param("superseded", {}, True, id="superseded"),
    ],
)
def test_outcome_rules(backend: BackendServer, kind: str, fields: dict[str, Any], ok: bool) -> None:
    event = {**outcome("ignored"), "kind": kind, **fields}
    answer = post(backend, batch(event)).json()
    assert bool(answer["accepted"]) is ok, answer


def test_both_schema_versions_are_accepted(backend: BackendServer) -> None:
    v1 = {
        k: v
        for k, v in decision(schema_version=1).items()
        if k not in ("silence_reason", "client_name", "client_version", "request_id")
        and k not in ("rank", "candidates")
    }
    v2 = decision(
        action="silence",
        silence_reason="latency",
        client_name="Visual Studio Code",
        client_version="1.96.0",
        request_id="r1",
        rank=1,
        candidates=3,
    )
    not_viewed = outcome("not_viewed")
    answer = post(backend, batch(v1, v2, not_viewed)).json()
    assert answer["rejected"] == []
    assert len(answer["accepted"]) == 3


def test_retention_cannot_exceed_accepted(backend: BackendServer) -> None:
    good = RetentionEvent(decision_id="d", after_s=30, accepted_chars=5, retained_chars=5)
    bad = {**good.model_dump(mode="json"), "event_id": str(uuid.uuid4()), "retained_chars": 6}
    answer = post(backend, batch(good.model_dump(mode="json"), bad)).json()
    assert len(answer["accepted"]) == 1
    assert answer["rejected"][0]["index"] == 1
    assert backend.summary()["retention"] == 1


def _ago(**delta: float) -> str:
    return (datetime.now(UTC) - timedelta(**delta)).isoformat()


# Values no client makes, each of which once went in and then broke the tenant's training.
@pytest.mark.parametrize(
    ("fields", "error"),
    [
        pytest.param(
            {"time": "2026-11-30T10:00:00"}, "time: Input should have timezone", id="naive-time"
        ),
        pytest.param({"time": -86_400}, "time: before", id="negative-unix-time"),
        pytest.param({"time": "0001-01-01T00:00:00Z"}, "time: before", id="year-1"),
        pytest.param({"time": "9999-12-31T23:59:59Z"}, "time: after", id="year-9999"),
        pytest.param({"time": _ago(days=31)}, "too old", id="older-than-the-window"),
        pytest.param({"time": _ago(days=-2)}, "in the future", id="ahead-of-the-window"),
        pytest.param({"propensity": 0}, "propensity", id="propensity-zero"),
        pytest.param({"suggestion_chars": 10**30}, "suggestion_chars", id="chars-1e30"),
        pytest.param({"suggestion_chars": 10**400}, "suggestion_chars", id="chars-1e400"),
        pytest.param({"suggestion_lines": 10**30}, "suggestion_lines", id="lines-1e30"),
        pytest.param({"features": {"prefix_len": 1e308}}, "less than or equal", id="feature-1e308"),
    ],
)
def test_out_of_bounds_values_are_rejected_alone(
    backend: BackendServer, fields: dict[str, Any], error: str
) -> None:
    good = [outcome(), decision(time=_ago(days=29))]  # inside the window, however old
    bad = decision(**fields)
    answer = post(backend, batch(good[0], bad, good[1])).json()
    assert answer["accepted"] == [good[0]["event_id"], good[1]["event_id"]]
    (rejection,) = answer["rejected"]
    assert rejection["index"] == 1 and rejection["event_id"] == bad["event_id"]
    assert error in rejection["error"]
    assert sorted(backend.stored_ids()) == sorted(e["event_id"] for e in good)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        pytest.param({"accepted_chars": 10**30}, "accepted_chars", id="accepted-chars-1e30"),
        pytest.param({"time": "2026-11-30T10:00:00"}, "time", id="naive-time"),
    ],
)
def test_out_of_bounds_outcomes_are_rejected_alone(
    backend: BackendServer, fields: dict[str, Any], error: str
) -> None:
    good = outcome()
    bad = outcome(**fields)
    answer = post(backend, batch(bad, good)).json()
    assert answer["accepted"] == [good["event_id"]]
    assert error in answer["rejected"][0]["error"]
    assert backend.stored_ids() == [good["event_id"]]


SMALL = IngestLimits(
    max_body_bytes=64 * 1024,
    max_batch_events=5,
    max_event_bytes=1024,
    rate_events_per_s=1e9,
    burst_events=1e9,
)


def _bomb() -> bytes:
    # 16 MiB of zeros in about 16 KiB: far under the body limit compressed, far over inflated.
    return gzip.compress(bytes(16 * 1024 * 1024))


@pytest.mark.parametrize(
    ("body", "gzipped", "headers", "status"),
    [
        pytest.param(b"{not json", True, {}, 400, id="not-json"),
        pytest.param(b'{"events": {}}', True, {}, 400, id="events-not-a-list"),
        pytest.param(b'{"events": [], "more": 1}', True, {}, 400, id="extra-top-level-key"),
        pytest.param(b"[1, 2]", True, {}, 400, id="not-an-object"),
        pytest.param(b"\x1f\x8b garbage", False, {"Content-Encoding": "gzip"}, 400, id="bad-gzip"),
        pytest.param(b"{}", False, {"Content-Encoding": "br"}, 415, id="unknown-encoding"),
        pytest.param(batch(*[outcome() for _ in range(6)]), True, {}, 413, id="batch-too-big"),
        pytest.param(
            batch(*[outcome() for _ in range(5)], {"type": "outcome"}),
            True,
            {},
            413,
            id="batch-too-big-with-an-invalid-event",
        ),
        pytest.param(b" " * (65 * 1024), False, {}, 413, id="plain-body-too-big"),
        pytest.param(b"", False, {"Content-Encoding": "gzip"}, 400, id="empty-gzip"),
    ],
)
def test_malformed_requests(
    tmp_path: Any, body: bytes, gzipped: bool, headers: dict[str, str], status: int
) -> None:
    with BackendServer(f"sqlite:///{tmp_path / 'b.sqlite3'}", limits=SMALL) as backend:
        response = post(backend, body, gzipped=gzipped, headers=headers)
        assert response.status_code == status, response.text
        assert "detail" in response.json()
        assert backend.stored_ids() == []


def test_gzip_bomb_is_refused_without_inflating_it(tmp_path: Any) -> None:
    bomb = _bomb()
    assert len(bomb) < SMALL.max_body_bytes
    with BackendServer(f"sqlite:///{tmp_path / 'b.sqlite3'}", limits=SMALL) as backend:
        response = post(backend, bomb, gzipped=False, headers={"Content-Encoding": "gzip"})
        assert response.status_code == 413
        assert backend.metrics.value("tabloop_events_rejected_total", reason="body_too_large") == 1


def test_oversized_event_is_rejected_alone(tmp_path: Any) -> None:
    with BackendServer(f"sqlite:///{tmp_path / 'b.sqlite3'}", limits=SMALL) as backend:
        big = decision(features={f"f{i}": float(i) for i in range(120)})
        small = outcome()
        answer = post(backend, batch(small, big)).json()
        assert answer["accepted"] == [small["event_id"]]
        assert answer["rejected"] == [
            {"index": 1, "event_id": big["event_id"], "error": "event too large"}
        ]


def test_a_batch_is_stored_as_the_json_of_its_events_and_refusals_keep_their_order() -> None:
    window = TimeWindow.around(datetime.now(UTC), IngestLimits())
    events = [parse_event(e) for e in (outcome(), decision(), outcome(kind="ignored"))]
    admitted = admit_valid(events, 10_000, window)
    # One JSON array, element by element each event's own JSON: what the "array" insert sends.
    assert admitted.joined == "[" + ",".join(e.model_dump_json() for e in events) + "]"
    assert admitted.event_ids == [str(e.event_id) for e in events] and not admitted.rejected

    late = parse_event(outcome(time=_ago(days=40)))
    big = parse_event(decision(features={f"f{i}": float(i) for i in range(120)}))
    admitted = admit_valid([late, big, events[0], big.model_copy()], 1024, window)
    assert [r.index for r in admitted.rejected] == [0, 1, 3]
    assert ["too old" in r.error for r in admitted.rejected] == [True, False, False]
    assert admitted.event_ids == [str(events[0].event_id)] and admitted.indexes == [2]
    assert admitted.texts == [events[0].model_dump_json()] and admitted.joined is None


@pytest.mark.parametrize(
    "authorization",
    [
        pytest.param(None, id="missing"),
        pytest.param("Bearer tl_not-a-real-token", id="unknown"),
        pytest.param("Basic dXNlcjpwYXNz", id="wrong-scheme"),
        pytest.param("Bearer", id="empty"),
    ],
)
def test_unauthorized(backend: BackendServer, authorization: str | None) -> None:
    headers = {"Content-Encoding": "gzip"}
    if authorization is not None:
        headers["Authorization"] = authorization
    response = httpx.post(
        backend.url + "/v1/events", content=gzip.compress(batch(outcome())), headers=headers
    )
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert backend.stored_ids() == []


def test_revoked_token_is_refused(backend: BackendServer) -> None:
    token = backend.storage.create_token(backend.tenant)
    assert post(backend, batch(outcome()), token=token).status_code == 200
    assert backend.storage.revoke_token(token)
    assert post(backend, batch(outcome()), token=token).status_code == 401
    assert not backend.storage.revoke_token(token)


def test_tenants_are_isolated(backend: BackendServer) -> None:
    other_token = backend.storage.create_token(f"other-{uuid.uuid4().hex[:6]}")
    other = backend.storage.principal_for_token(other_token)
    assert other is not None and other.tenant_id != backend.tenant_id
    mine = [decision(), outcome()]
    assert len(post(backend, batch(*mine)).json()["accepted"]) == 2
    # The same ids from another tenant are new to it: nothing reveals what we stored.
    theirs = [{**decision(), "event_id": mine[0]["event_id"], "action": "silence"}]
    answer = post(backend, batch(*theirs), token=other_token).json()
    assert answer["accepted"] == [mine[0]["event_id"]]
    assert backend.summary()["decisions"] == {"show": 1}
    assert backend.storage.summary(other.tenant_id)["decisions"] == {"silence": 1}
    assert backend.storage.event_ids(other.tenant_id) == [mine[0]["event_id"]]
    stored = dict(backend.storage.events(backend.tenant_id, type="decision"))
    assert [body["action"] for body in stored.values()] == ["show"]


def test_rate_limit_answers_429_with_retry_after(tmp_path: Any) -> None:
    limits = IngestLimits(rate_events_per_s=1.0, burst_events=3, max_batch_events=3)
    with BackendServer(f"sqlite:///{tmp_path / 'b.sqlite3'}", limits=limits) as backend:
        assert post(backend, batch(outcome(), outcome(), outcome())).status_code == 200
        refused = post(backend, batch(outcome(), outcome()))
        assert refused.status_code == 429
        assert int(refused.headers["Retry-After"]) >= 1
        assert len(backend.stored_ids()) == 3
        assert backend.metrics.value("tabloop_events_rejected_total", reason="rate_limited") == 2


def test_health_and_metrics(backend: BackendServer) -> None:
    health = httpx.get(backend.url + "/healthz")
    assert health.status_code == 200
    assert health.json()["status"] == "ok"
    post(backend, batch(decision(), {"type": "decision"}))
    text = httpx.get(backend.url + "/metrics").text
    assert 'tabloop_events_ingested_total{type="decision"} 1' in text
    assert 'tabloop_events_rejected_total{reason="invalid"} 1' in text
    assert "# TYPE tabloop_events_duplicate_total counter" in text
    assert 'tabloop_ingest_requests_total{status="200"} 1' in text
