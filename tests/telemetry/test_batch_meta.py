"""The sender's batch `meta` (its spool's backlog and drops) against the real backend."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import httpx

from telemetry.events import OutcomeEvent
from telemetry.sender import Sender
from telemetry.spool import Spool
from tests.support.backend_server import BackendServer


def spooled(tmp_path: Path, n: int) -> Spool:
    spool = Spool(tmp_path / "spool.sqlite3")
    events = [OutcomeEvent(decision_id=f"d{i}", kind="ignored") for i in range(n)]
    spool.append([(str(e.event_id), e.model_dump_json().encode()) for e in events])
    return spool


def sender(spool: Spool, backend: BackendServer, install_id: str | None) -> Sender:
    return Sender(
        spool,
        url=backend.url,
        token=backend.token,
        batch_size=100,
        retry_deadline_s=5.0,
        backoff_initial_s=0.01,
        backoff_max_s=0.05,
        rng=random.Random(3),
        install_id=install_id,
    )


def test_each_batch_reports_the_spool_and_the_backend_keeps_the_newest(
    tmp_path: Path, backend: BackendServer
) -> None:
    spool = spooled(tmp_path, 250)
    spool.add_dropped(4)
    assert sender(spool, backend, "laptop-7").drain(time.monotonic() + 30)
    metas = [json.loads(body)["meta"] for body in backend.bodies]
    assert metas == [
        {"install_id": "laptop-7", "spool_backlog": backlog, "spool_dropped": 4}
        for backlog in (150, 50, 0)
    ]
    answer = httpx.get(
        f"{backend.url}/v1/stats/ingestion",
        params={"window": "1h"},
        headers={"Authorization": f"Bearer {backend.token}"},
    ).json()
    assert [(s["install_id"], s["backlog"], s["dropped"]) for s in answer["spools"]] == [
        ("laptop-7", 0, 4)
    ]
    assert answer["totals"]["accepted"] == 250 and answer["totals"]["batches"] == 3


def test_without_an_installation_id_no_meta_is_sent(
    tmp_path: Path, sqlite_backend: BackendServer
) -> None:
    spool = spooled(tmp_path, 10)
    assert sender(spool, sqlite_backend, None).drain(time.monotonic() + 30)
    assert ["meta" in json.loads(body) for body in sqlite_backend.bodies] == [False]


def test_a_backend_that_refuses_meta_gets_the_batch_without_it(
    tmp_path: Path, sqlite_backend: BackendServer
) -> None:
    spool = spooled(tmp_path, 30)
    sending = sender(spool, sqlite_backend, "laptop-8")
    sqlite_backend.faults.add(400)  # what a backend older than `meta` answers
    assert sending.drain(time.monotonic() + 30)
    bodies = [json.loads(body) for body in sqlite_backend.bodies]
    assert ["meta" in body for body in bodies] == [True, False]
    assert len(sqlite_backend.stored_ids()) == 30
    assert spool.stats().quarantined_events == 0 and sending.stats.quarantined_events == 0
