"""A sending client killed with SIGKILL at random moments loses nothing and stores nothing twice."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from telemetry.events import OutcomeEvent
from telemetry.spool import Spool
from tests.support.backend_server import BackendServer

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 6
EVENTS_PER_ROUND = 200

SENDER = """
import sys, time
from pathlib import Path
from telemetry.sender import Sender
from telemetry.spool import Spool
spool = Spool(Path(sys.argv[1]))
sender = Sender(spool, url=sys.argv[2], token=sys.argv[3], batch_size=20,
                backoff_initial_s=0.01, backoff_max_s=0.1)
print("ready", flush=True)
print("drained" if sender.drain(time.monotonic() + 120) else "pending", flush=True)
"""


def run_sender(
    spool_path: Path, backend: BackendServer, kill_at_request: int | None, rng: random.Random
) -> bool:
    """Run a sender process; kill it as its `kill_at_request`-th request of this round reaches
    the backend (plus a random few milliseconds), or let it drain. True if it was killed alive."""
    seen = len(backend.bodies)
    process = subprocess.Popen(
        [sys.executable, "-c", SENDER, str(spool_path), backend.url, backend.token],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    if kill_at_request is None:
        assert process.stdout.readline().strip() == "drained"
        assert process.wait(60) == 0
        return False
    deadline = time.monotonic() + 60
    while len(backend.bodies) < seen + kill_at_request and process.poll() is None:
        assert time.monotonic() < deadline, "the sender made no progress"
        time.sleep(0.001)
    time.sleep(rng.uniform(0.0, 0.02))  # before, during or after the backend's commit
    killed = process.poll() is None
    process.send_signal(signal.SIGKILL)
    process.wait(30)
    return killed


def test_sigkill_during_sends_loses_and_duplicates_nothing(
    tmp_path: Path, sqlite_backend: BackendServer
) -> None:
    rng = random.Random(20261130)
    spool_path = tmp_path / "spool.sqlite3"
    expected: set[str] = set()
    killed_mid_stream = 0
    for round_ in range(ROUNDS):
        events = [
            OutcomeEvent(decision_id=f"r{round_}-{i}", kind="ignored")
            for i in range(EVENTS_PER_ROUND)
        ]
        spool = Spool(spool_path)
        spool.append([(str(e.event_id), e.model_dump_json().encode()) for e in events])
        spool.close()
        expected |= {str(e.event_id) for e in events}
        # A round sends about 10 batches of 20 (more when earlier rounds left events behind).
        if run_sender(spool_path, sqlite_backend, rng.randint(1, 9), rng):
            killed_mid_stream += 1
    run_sender(spool_path, sqlite_backend, None, rng)

    stored = sqlite_backend.stored_ids()
    assert len(stored) == len(set(stored))  # none twice
    assert set(stored) == expected  # none lost
    assert Spool(spool_path).stats().events == 0
    assert killed_mid_stream >= ROUNDS // 2, "the kills should land while sending"
