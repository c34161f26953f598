"""The sync client on its own: the shared retry rule, and answers read against the protocol."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from email.utils import formatdate

import pytest

from indexer.sync_client import SyncClient, SyncFailed, SyncRejected
from tests.support.scripted_http import Answer, ScriptedServer

K = "a" * 32
ROOT = json.dumps({"root": "c" * 64}).encode()


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    with ScriptedServer() as running:
        yield running


def client_of(server: ScriptedServer) -> SyncClient:
    return SyncClient(server.url, "tl_token", retry_deadline_s=30.0, backoff_initial_s=0.01)


def test_an_http_date_retry_after_is_honoured(server: ScriptedServer) -> None:
    # Whole seconds on the wire, and a busy machine may take a while to ask: only "clearly
    # longer than the 10 ms backoff, never longer than the date" is certain.
    server.script = [Answer(503, {"Retry-After": formatdate(time.time() + 3, usegmt=True)})]
    server.script.append(Answer(200, body=ROOT))
    client = client_of(server)
    try:
        assert client.root(K, K) == "c" * 64
        assert 0.2 <= client.http.stats.last_retry_delay_s <= 3.0
        assert client.stats.requests == 2
    finally:
        client.close()


def test_an_answer_outside_the_protocol_fails_the_sync(server: ScriptedServer) -> None:
    server.script = [Answer(200, body=b'{"root": "not a hash"}')]
    client = client_of(server)
    try:
        with pytest.raises(SyncFailed, match="unreadable answer"):
            client.root(K, K)
    finally:
        client.close()


def test_a_final_refusal_carries_the_servers_detail(server: ScriptedServer) -> None:
    server.script = [Answer(422, body=b'{"detail": "model: bad key"}')]
    client = client_of(server)
    try:
        with pytest.raises(SyncRejected) as refused:
            client.known(K, [K])
        assert (refused.value.status, refused.value.detail) == (422, "model: bad key")
        assert len(server.bodies) == 1
    finally:
        client.close()


@pytest.mark.parametrize("status", [401, 404])
def test_a_refused_client_is_rejected_at_once_with_its_status(
    server: ScriptedServer, status: int
) -> None:
    # A rotated token or a wrong URL: no retries within the call; the sync loop records the
    # error and tries again after its backoff, deleting nothing.
    server.script = [Answer(status, body=b'{"detail": "no"}')]
    client = client_of(server)
    try:
        with pytest.raises(SyncRejected) as refused:
            client.root(K, K)
        assert refused.value.status == status
        assert len(server.bodies) == 1
    finally:
        client.close()


def test_a_500_is_retried(server: ScriptedServer) -> None:
    # The backend answers 500 for a database timeout, which passes.
    server.script = [Answer(500), Answer(200, body=ROOT)]
    client = client_of(server)
    try:
        assert client.root(K, K) == "c" * 64
        assert len(server.bodies) == 2
    finally:
        client.close()


def test_the_request_is_the_protocols_gzipped_json(server: ScriptedServer) -> None:
    import gzip

    server.script = [
        Answer(
            200, body=b'{"children": {"": [["' + K.encode() + b'", "' + b"d" * 64 + b'", true]]}}'
        )
    ]
    client = client_of(server)
    try:
        assert client.children(K, K, [""]) == {"": [(K, "d" * 64, True)]}
    finally:
        client.close()
    (body,) = server.bodies
    assert json.loads(gzip.decompress(body)) == {"workspace": K, "model": K, "dirs": [""]}
