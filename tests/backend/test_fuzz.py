"""Hostile input against the real backend on loopback: schema-driven fuzzing and hand-made attacks.

The schema-driven part lets schemathesis generate requests for every operation of the app's own
OpenAPI schema (valid and invalid bodies), derandomized so every run sends the same cases, and
asserts that none gets a 5xx. The hand-made part covers what a generator does not reach: nesting
and gzip bombs, `Content-Length` lies sent over raw sockets, tenants reaching for each other's
data, and batches sent twice.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from backend.deps import get_completion_service
from backend.local import LocalBackend
from backend.ratelimit import RequestRates, RequestRateSettings
from backend.services.completions import CompletionService
from backend.settings import BodyLimits
from completion.gate import builtin_policy
from completion.settings import CompletionSettings
from indexer.sync_protocol import (
    APPLY_PATH,
    CHILDREN_PATH,
    KNOWN_PATH,
    ROOT_PATH,
    VECTORS_PATH,
)
from telemetry.events import OutcomeEvent
from tests.support.backend_server import BackendServer
from tests.support.scripted_model import ScriptedModel

JSON_ROUTES = [
    "/v1/events",
    ROOT_PATH,
    CHILDREN_PATH,
    KNOWN_PATH,
    VECTORS_PATH,
    APPLY_PATH,
    "/v1/completions",
]
EXAMPLES_PER_OPERATION = 24
"""Per operation and generation mode: about 500 cases, some 80 s on a busy 2-core machine (40
made 880 cases in 141 s)."""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[BackendServer]:
    """The real backend on SQLite, its completion model a scripted one (no weights to load)."""
    service = CompletionService(
        CompletionSettings(), tmp_path / "cache", lambda _settings, _cache: ScriptedModel()
    )
    with BackendServer(f"sqlite:///{tmp_path / 'backend.sqlite3'}") as server:
        server.app.dependency_overrides[get_completion_service] = lambda: service
        yield server
    service.close()


def _auth(server: BackendServer, token: str | None = None) -> dict[str, str]:
    return {"Authorization": f"Bearer {server.token if token is None else token}"}


# Raw HTTP/1.1, for what an HTTP client will not send: bodies that disagree with their headers.


def _connect(server: LocalBackend) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.settimeout(10)
    return sock


def _request(
    server: LocalBackend, path: str, body: bytes, *, length: int | None = None, **headers: str
) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: 127.0.0.1:{server.port}",
        f"Authorization: Bearer {server.token}",
        "Content-Type: application/json",
        f"Content-Length: {len(body) if length is None else length}",
        *(f"{name.replace('_', '-')}: {value}" for name, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One response read off `sock` (status, lower-cased headers, body); framed by its length.

    Nothing past the response is read: when two responses arrive together, the next call finds
    the second one whole (the head is read a byte at a time, the body to its length)."""
    data = b""
    while not data.endswith(b"\r\n\r\n"):
        piece = sock.recv(1)
        if not piece:
            raise ConnectionError(f"closed before a response; got {data!r}")
        data += piece
    head, body = data[:-4], b""
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        piece = sock.recv(length - len(body))
        if not piece:
            break
        body += piece
    return int(status_line.split()[1]), headers, body


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, TimeoutError):
        return True


# Depth, size and framing: the defects this suite was written for.


@pytest.mark.parametrize("path", JSON_ROUTES)
def test_a_depth_bomb_is_400_and_the_connection_stays_open(
    served: BackendServer, path: str
) -> None:
    bomb = b'{"events": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with _connect(served) as sock:
        sock.sendall(_request(served, path, bomb))
        status, _, body = _response(sock)
        assert status == 400, body
        assert "nested deeper than 64" in json.loads(body)["detail"]
        # Same connection, next request: a refusal is an answer, not a dropped connection.
        sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{served.port}\r\n\r\n".encode())
        assert _response(sock)[0] == 200


def test_a_gzipped_depth_bomb_is_400(served: BackendServer) -> None:
    bomb = gzip.compress(b"[" * 1_000_000)  # 1 KiB on the wire
    answer = httpx.post(
        served.url + "/v1/events",
        content=bomb,
        headers={**_auth(served), "Content-Encoding": "gzip"},
        timeout=30,
    )
    assert answer.status_code == 400
    assert served.metrics.value("tabloop_events_rejected_total", reason="too_deep") == 1


def test_nesting_within_the_limit_is_parsed(served: BackendServer) -> None:
    # 60 levels inside a string field's neighbour: refused by the schema (422), not the bound.
    nested = "[" * 60 + "]" * 60
    body = f'{{"workspace": {nested}, "model": "m"}}'.encode()
    answer = httpx.post(served.url + ROOT_PATH, content=body, headers=_auth(served), timeout=30)
    assert answer.status_code == 422


@pytest.mark.parametrize(
    ("path", "body"),
    [
        pytest.param(ROOT_PATH, b'{"workspace": ' + b"7" * 5000 + b', "model": "m"}', id="index"),
        pytest.param("/v1/events", b'{"events": [{"time": ' + b"7" * 5000 + b"}]}", id="events"),
    ],
)
def test_an_integer_past_pythons_digit_limit_is_400(
    served: BackendServer, path: str, body: bytes
) -> None:
    answer = httpx.post(served.url + path, content=body, headers=_auth(served), timeout=30)
    assert answer.status_code == 400


@pytest.mark.parametrize("path", ["/v1/events", APPLY_PATH])
def test_a_gzip_bomb_is_413(served: BackendServer, path: str) -> None:
    bomb = gzip.compress(b" " * (64 * 1024 * 1024), compresslevel=9)  # 64 MiB from ~64 KiB
    answer = httpx.post(
        served.url + path,
        content=bomb,
        headers={**_auth(served), "Content-Encoding": "gzip"},
        timeout=30,
    )
    assert answer.status_code == 413
    assert "inflated" in answer.json()["detail"]


def test_a_body_shorter_than_its_content_length_is_answered_408_and_closed(
    tmp_path: Path,
) -> None:
    # The plain app: the recording fixture reads whole bodies before the app sees them.
    with LocalBackend(f"sqlite:///{tmp_path / 'plain.sqlite3'}") as plain:
        plain.services.bodies = BodyLimits(read_timeout_s=0.5)
        with _connect(plain) as sock:
            started = time.monotonic()
            sock.sendall(_request(plain, "/v1/events", b'{"events": []}', length=1000))
            status, headers, _ = _response(sock)
            assert status == 408
            assert time.monotonic() - started < 5
            assert headers.get("connection") == "close"
            assert _closed(sock)
        assert plain.stored_ids() == []


@pytest.mark.parametrize("path", ["/v1/policy/promote", "/v1/policy/rollback"])
def test_a_registry_action_reads_no_body_before_the_token_and_stalls_answer_408(
    tmp_path: Path, path: str
) -> None:
    with LocalBackend(f"sqlite:///{tmp_path / 'plain.sqlite3'}") as plain:
        plain.services.bodies = BodyLimits(read_timeout_s=0.5)
        # 60 MiB announced, a few bytes sent, no token: refused at once, the body never read.
        with _connect(plain) as sock:
            request = _request(plain, path, b'{"version"', length=60 * 1024 * 1024)
            sock.sendall(request.replace(f"Bearer {plain.token}".encode(), b"Bearer tl_wrong"))
            status, _, _ = _response(sock)
            assert status == 401
        # With a token: over the action's cap unread, and a short body is 408.
        with _connect(plain) as sock:
            sock.sendall(_request(plain, path, b"{}", length=60 * 1024 * 1024))
            assert _response(sock)[0] == 413
        with _connect(plain) as sock:
            sock.sendall(_request(plain, path, b'{"version":', length=1000))
            status, headers, _ = _response(sock)
            assert status == 408 and headers.get("connection") == "close"
        # Nesting is bounded as on every JSON route.
        with _connect(plain) as sock:
            sock.sendall(_request(plain, path, b'{"reason": ' + b"[" * 100 + b"]" * 100 + b"}"))
            status, _, body = _response(sock)
            assert status == 400 and b"nested deeper" in body


def test_statistics_and_registry_actions_are_rate_limited(served: BackendServer) -> None:
    served.services.request_rates = RequestRates(
        RequestRateSettings(stats_per_s=0.01, stats_burst=3, policy_per_s=0.01, policy_burst=2)
    )
    codes = [
        httpx.get(f"{served.url}/v1/stats/overview", headers=_auth(served)).status_code
        for _ in range(5)
    ]
    assert codes[:3] == [200] * 3 and codes[3:] == [429, 429], codes
    refused = httpx.get(f"{served.url}/v1/stats/tenants", headers=_auth(served))
    assert int(refused.headers["retry-after"]) >= 1
    actions = [
        httpx.post(
            f"{served.url}/v1/policy/rollback", json={"version": "v1"}, headers=_auth(served)
        ).status_code
        for _ in range(4)
    ]
    assert actions[:2] == [409, 409] and actions[2:] == [429, 429], actions
    # Another tenant's buckets are its own.
    other = served.storage.create_token(f"other-{uuid.uuid4().hex[:6]}")
    assert httpx.get(f"{served.url}/v1/stats/tenants", headers=_auth(served, other)).is_success


@pytest.mark.parametrize(
    "path",
    [
        "/v1/stats/tenants",
        "/v1/stats/overview",
        "/v1/stats/by/language",
        "/v1/stats/policies",
        "/v1/stats/ingestion",
        "/v1/policy/versions",
    ],
)
def test_a_tenants_json_is_never_stored_by_a_cache(served: BackendServer, path: str) -> None:
    answer = httpx.get(f"{served.url}{path}", headers=_auth(served), timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["cache-control"] == "no-store"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.parametrize("path", ["/v1/events", ROOT_PATH, "/v1/completions"])
def test_a_client_that_disconnects_mid_body_is_counted_not_logged_as_an_error(
    tmp_path: Path, path: str
) -> None:
    records = _Records()
    loggers = [logging.getLogger(name) for name in ("", "uvicorn", "uvicorn.error")]
    for logger in loggers:
        logger.addHandler(records)
    try:
        with LocalBackend(f"sqlite:///{tmp_path / 'plain.sqlite3'}") as plain:
            sock = _connect(plain)
            sock.sendall(_request(plain, path, b'{"events": [', length=1000))
            time.sleep(0.3)  # the route is reading the body
            sock.close()
            deadline = time.monotonic() + 10
            metric = 'tabloop_events_rejected_total{reason="disconnected"} 1'
            while metric not in httpx.get(f"{plain.url}/metrics").text:
                assert time.monotonic() < deadline, "the disconnect was not counted"
                time.sleep(0.1)
    finally:
        for logger in loggers:
            logger.removeHandler(records)
    errors = [r.getMessage() for r in records.records if r.levelno >= logging.ERROR]
    assert not errors, errors


def test_a_body_longer_than_its_content_length_is_cut_there(served: BackendServer) -> None:
    event = OutcomeEvent(decision_id=uuid.uuid4().hex, kind="dismissed")
    batch = json.dumps({"events": [event.model_dump(mode="json")]}).encode()
    with _connect(served) as sock:
        # What follows the declared length is read as the next request, which is not HTTP.
        sock.sendall(_request(served, "/v1/events", batch + b"GARBAGE\r\n\r\n", length=len(batch)))
        status, _, body = _response(sock)
        assert status == 200, body
        # The server answers 400 or hangs up on it: either way, no 5xx.
        with contextlib.suppress(ConnectionError):
            assert _response(sock)[0] == 400
    assert served.stored_ids() == [str(event.event_id)]


def test_a_truncated_json_body_is_400(served: BackendServer) -> None:
    batch = b'{"events": [{"event_id": "x"'
    answer = httpx.post(served.url + "/v1/events", content=batch, headers=_auth(served))
    assert answer.status_code == 400


# Tenants and idempotence.


def test_a_tenant_cannot_reach_another_tenants_events_index_or_policies(
    served: BackendServer,
) -> None:
    other_token = served.storage.create_token(f"other-{uuid.uuid4().hex[:6]}")
    other = served.storage.principal_for_token(other_token)
    assert other is not None
    # B stores an event, an index tree and a promoted policy.
    event = OutcomeEvent(decision_id=uuid.uuid4().hex, kind="accepted", accepted_chars=3)
    sent = httpx.post(
        served.url + "/v1/events",
        json={"events": [event.model_dump(mode="json")]},
        headers=_auth(served, other_token),
    )
    assert sent.json()["accepted"] == [str(event.event_id)]
    workspace, model = "a" * 32, "b" * 32
    upsert = {"path": "c" * 32, "leaf": "d" * 64, "chunks": []}
    apply = {"workspace": workspace, "model": model, "upserts": [upsert]}
    placed = httpx.post(served.url + APPLY_PATH, json=apply, headers=_auth(served, other_token))
    assert placed.status_code == 200, placed.text
    version = served.services.registry.add(other.tenant_id, builtin_policy().derive, {}).version
    served.services.registry.promote(other.tenant_id, version, actor="test")

    # A sees none of it, and writing the same ids leaves B's rows alone.
    assert served.stored_ids() == []
    versions = httpx.get(served.url + "/v1/policy/versions", headers=_auth(served)).json()
    assert version not in json.dumps(versions)
    policy = httpx.get(served.url + "/v1/policy", headers=_auth(served))
    assert policy.headers["X-Tabloop-Policy-Version"] != version
    ref = {"workspace": workspace, "model": model}
    mine = httpx.post(served.url + ROOT_PATH, json=ref, headers=_auth(served)).json()["root"]
    assert mine != placed.json()["root"]
    listed = httpx.post(
        served.url + CHILDREN_PATH, json={**ref, "dirs": [""]}, headers=_auth(served)
    ).json()
    assert listed["children"] == {"": []}
    again = httpx.post(
        served.url + "/v1/events",
        json={"events": [event.model_dump(mode="json")]},
        headers=_auth(served),
    )
    assert again.json()["accepted"] == [str(event.event_id)]  # new to A: nothing reveals B's rows
    assert served.storage.event_ids(other.tenant_id) == [str(event.event_id)]
    assert served.storage.event_ids(served.tenant_id) == [str(event.event_id)]


def test_the_same_batch_posted_twice_is_stored_once(served: BackendServer) -> None:
    events = [
        OutcomeEvent(decision_id=uuid.uuid4().hex, kind="dismissed").model_dump(mode="json")
        for _ in range(5)
    ]
    first = httpx.post(served.url + "/v1/events", json={"events": events}, headers=_auth(served))
    second = httpx.post(served.url + "/v1/events", json={"events": events}, headers=_auth(served))
    assert len(first.json()["accepted"]) == 5
    assert second.json() == {**first.json(), "accepted": [], "duplicate": first.json()["accepted"]}
    assert sorted(served.stored_ids()) == sorted(e["event_id"] for e in events)


# What is served without a token.


def test_metrics_name_no_tenant_unless_configured(served: BackendServer) -> None:
    event = OutcomeEvent(decision_id=uuid.uuid4().hex, kind="dismissed").model_dump(mode="json")
    httpx.post(served.url + "/v1/events", json={"events": [event]}, headers=_auth(served))
    assert served.tenant not in httpx.get(served.url + "/metrics").text
    served.services.metrics.tenant_labels = True
    event = OutcomeEvent(decision_id=uuid.uuid4().hex, kind="dismissed").model_dump(mode="json")
    httpx.post(served.url + "/v1/events", json={"events": [event]}, headers=_auth(served))
    assert f'tenant="{served.tenant}"' in httpx.get(served.url + "/metrics").text


def test_docs_are_open_and_name_no_tenant(served: BackendServer) -> None:
    for path in ("/docs", "/openapi.json"):
        answer = httpx.get(served.url + path)
        assert answer.status_code == 200
        assert served.tenant not in answer.text and served.token not in answer.text


# Schema-driven fuzzing.


def test_generated_requests_never_get_a_server_error(
    served: BackendServer, record_property: Any
) -> None:
    schema = schemathesis.openapi.from_url(served.url + "/openapi.json")
    session = requests.Session()
    session.headers.update(_auth(served))
    cases: dict[str, int] = {}
    operations = [result.ok() for result in schema.get_all_operations()]
    strategy = st.one_of(
        operation.as_strategy(generation_mode=mode)
        for operation in operations
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    )

    @settings(
        max_examples=EXAMPLES_PER_OPERATION * 2 * len(operations),
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: a failure is reported as found
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def send(case: schemathesis.Case) -> None:
        label = f"{case.method} {case.path}"
        cases[label] = cases.get(label, 0) + 1
        response = case.call(base_url=served.url, session=session, timeout=30)
        case.validate_response(response, checks=[not_a_server_error])

    started = time.monotonic()
    send()
    total = sum(cases.values())
    record_property("fuzz_cases", total)
    print(f"fuzz: {total} cases in {time.monotonic() - started:.1f} s: {cases}")
    assert len(cases) == len(operations)  # every operation was exercised
    assert total >= 10 * len(operations)
