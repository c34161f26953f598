"""`tabloop backend --workers N`: several processes on one port, one database, one answer."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backend.cli import _claim_training, backend_main
from backend.db.migrate import current_revision, head_revision
from backend.local import bind_loopback, wait_until_healthy
from backend.storage import Storage
from telemetry.events import OutcomeEvent

ROOT = Path(__file__).resolve().parents[2]
WORKERS = 2
CLIENTS = 6
EVENTS = 100


def _worker_pids(pid: int) -> list[int]:
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.fixture
def served(db_url: str) -> Iterator[tuple[str, str]]:
    """`tabloop backend --workers 2` on a free port: its URL and its database URL."""
    with bind_loopback() as probe:
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "backend.cli", "--port", str(port), "--db", db_url),
            *("--workers", str(WORKERS), "--rate", "1e12"),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180  # each worker imports the whole backend
        wait_until_healthy(url, process, timeout=180, interval=0.2)
        while len(_worker_pids(process.pid)) < WORKERS:  # every worker, not just the first
            assert time.monotonic() < deadline, "workers did not start"
            time.sleep(0.2)
        yield url, db_url
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) in (0, -signal.SIGTERM)
        errors = process.stderr.read().decode() if process.stderr else ""
        assert "Traceback" not in errors, errors


def test_workers_store_a_batch_sent_to_all_of_them_once(served: tuple[str, str]) -> None:
    url, db_url = served
    storage = Storage(db_url, migrate=False)  # the server migrated it, once, before its workers
    try:
        assert current_revision(storage.engine) == head_revision()
        token = storage.create_token(f"workers-{os.getpid()}-{time.monotonic_ns()}")
        principal = storage.principal_for_token(token)
        assert principal is not None
        events = [OutcomeEvent(decision_id=f"w{i}", kind="ignored") for i in range(EVENTS)]
        body = gzip.compress(
            ('{"events":[' + ",".join(e.model_dump_json() for e in events) + "]}").encode()
        )
        headers = {"Authorization": f"Bearer {token}", "Content-Encoding": "gzip"}
        answers: list[dict[str, list[str]]] = []
        failures: list[str] = []
        start = threading.Barrier(CLIENTS)

        def post() -> None:
            # A connection of its own each, so the kernel spreads them over the workers.
            with httpx.Client(timeout=60) as http:
                start.wait()
                for _ in range(3):
                    answer = http.post(f"{url}/v1/events", content=body, headers=headers)
                    if answer.status_code != 200:
                        failures.append(f"{answer.status_code}: {answer.text[:200]}")
                    else:
                        answers.append(answer.json())

        threads = [threading.Thread(target=post) for _ in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert failures == []
        assert len(answers) == CLIENTS * 3
        accepted = Counter(event_id for a in answers for event_id in a["accepted"])
        ids = {str(e.event_id) for e in events}
        assert set(accepted) == ids and set(accepted.values()) == {1}  # each accepted once
        for answer in answers:
            assert set(answer["accepted"]) | set(answer["duplicate"]) == ids
            assert answer["rejected"] == []
        stored = storage.event_ids(principal.tenant_id)
        assert sorted(stored) == sorted(ids)
    finally:
        storage.close()


def test_exactly_one_worker_claims_training(tmp_path: Path) -> None:
    lock = str(tmp_path / "training.lock")
    first = _claim_training(lock)
    try:
        assert first is not None
        assert _claim_training(lock) is None  # another worker serves without training
    finally:
        assert first is not None
        first.close()
    second = _claim_training(lock)  # the trainer died: its replacement takes over
    assert second is not None
    second.close()


def test_workers_must_be_positive() -> None:
    assert backend_main(["--workers", "0"]) == 2
