"""Several instances on one PostgreSQL database: the trainer lease, training jobs, fenced
promotions, shared rate limits (in process); the election's fail-over and exactly-once ingestion
across two real backend processes.

Each test gets a database of its own: training jobs are claimed across tenants.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from backend.cluster import TRAINER_LEASE, JobQueue, Lease, LeaseLost, lease_state, pid_of_holder
from backend.db.models import StoredEvent
from backend.local import bind_loopback, wait_until_healthy
from backend.policy.registry import PolicyRegistry
from backend.policy.settings import TrainerSettings
from backend.ratelimit import SharedRateLimiter
from backend.scheduler import ClusterTrainer
from backend.storage import Storage
from completion.gate import builtin_policy
from telemetry.events import OutcomeEvent, parse_event
from tests.backend.policy.synthetic import Logger, contexts, to_events
from tests.support.backend_server import postgres_database, postgres_url

REPO_ROOT = Path(__file__).resolve().parents[2]
FAST = TrainerSettings(min_events=100, steps=20, canary_share=0.0)

pytestmark = pytest.mark.skipif(
    postgres_url() is None, reason="needs PostgreSQL (TABLOOP_TEST_POSTGRES_URL; .ci/run sets it)"
)


@pytest.fixture
def pg_url() -> Iterator[str]:
    with postgres_database() as url:
        yield url


@pytest.fixture
def storage(pg_url: str) -> Iterator[Storage]:
    store = Storage(pg_url)
    yield store
    store.close()


def _expire(storage: Storage, seconds: float) -> None:
    """Wait until leases and claims of `seconds` have run out (by the database's clock)."""
    time.sleep(seconds + 0.2)


# -- the lease ---------------------------------------------------------------------------------


def test_one_holder_at_a_time_and_the_epoch_moves_with_the_holder(storage: Storage) -> None:
    first = Lease(storage.engine, TRAINER_LEASE, "a", ttl_s=60)
    second = Lease(storage.engine, TRAINER_LEASE, "b", ttl_s=60)

    assert first.acquire() and first.epoch == 1
    assert not second.acquire() and second.epoch is None
    assert first.acquire() and first.epoch == 1  # a renewal keeps the epoch
    state = lease_state(storage.engine, TRAINER_LEASE)
    assert state is not None and (state.holder, state.live) == ("a", True)

    first.release()
    assert second.acquire() and second.epoch == 2
    assert not first.acquire()


def test_an_expired_lease_is_taken_over_and_fences_its_old_holder(storage: Storage) -> None:
    dead = Lease(storage.engine, TRAINER_LEASE, "dead", ttl_s=1)
    assert dead.acquire()
    with storage.session() as session:
        dead.fence(session)  # held: passes

    _expire(storage, 1)
    heir = Lease(storage.engine, TRAINER_LEASE, "heir", ttl_s=60)
    assert heir.acquire() and heir.epoch == 2
    with storage.session() as session, pytest.raises(LeaseLost):
        dead.fence(session)
    assert not dead.acquire()  # it cannot take it back while the heir renews


def test_leases_need_postgresql(tmp_path: Path) -> None:
    store = Storage(f"sqlite:///{tmp_path / 'b.sqlite3'}")
    try:
        with pytest.raises(ValueError, match="PostgreSQL"):
            Lease(store.engine, TRAINER_LEASE, "a", ttl_s=1)
    finally:
        store.close()


# -- training jobs -----------------------------------------------------------------------------


def _logged_tenant(storage: Storage, name: str) -> int:
    tenant = storage.ensure_tenant(name)
    start = datetime.now(UTC) - timedelta(hours=1)
    logged = Logger(builtin_policy(), seed=4).log(contexts(300, seed=3), start=start)
    storage.insert_events(tenant, [parse_event(e) for e in to_events(logged)])
    return tenant


def test_trainers_claim_different_jobs_and_skip_locked_ones(storage: Storage) -> None:
    tenants = [storage.ensure_tenant(f"t{i}") for i in range(3)]
    queue = JobQueue(storage.engine, "x", ttl_s=60)
    for tenant in tenants:
        queue.want(tenant, 10)
    one = JobQueue(storage.engine, "one", ttl_s=60).claim()
    two = JobQueue(storage.engine, "two", ttl_s=60).claim()
    three = JobQueue(storage.engine, "three", ttl_s=60).claim()
    assert one and two and three
    assert sorted([one.tenant_id, two.tenant_id, three.tenant_id]) == sorted(tenants)
    assert JobQueue(storage.engine, "four", ttl_s=60).claim() is None  # all held


def test_a_killed_trainers_job_is_claimed_again_and_its_writes_are_refused(
    storage: Storage,
) -> None:
    tenant = _logged_tenant(storage, "acme")
    scheduler = ClusterTrainer(storage, FAST, failover_s=1.5)  # leases of 1 s
    assert scheduler.schedule() == 1
    dead = JobQueue(storage.engine, "dead-trainer", ttl_s=1)
    lost = dead.claim()
    assert lost is not None and lost.tenant_id == tenant and lost.attempts == 1
    # The dead trainer never renews; its claim runs out and another trainer takes the job.
    _expire(storage, 1)
    heir = ClusterTrainer(storage, FAST, failover_s=60, elect=False)
    summary = heir.run_next()
    # Whether v1 is promoted depends on what was trained, which this test does not judge.
    assert summary is not None and summary.candidate == "v1"
    (job,) = heir.queue.jobs()
    assert (job["runs"], job["claimed_by"], job["attempts"]) == (1, None, 0)
    assert job["done_event_id"] == job["wanted_event_id"]

    # Had the first trainer been alive after all, nothing it writes gets through.
    history = PolicyRegistry(storage).history(tenant)
    registry = PolicyRegistry(storage).fenced(lambda session: dead.fence(lost, session))
    with pytest.raises(LeaseLost):
        registry.promote(tenant, "v1", actor="dead-trainer")
    with pytest.raises(LeaseLost):
        registry.add(tenant, builtin_policy().derive, {})
    assert PolicyRegistry(storage).history(tenant) == history
    assert [v.version for v in PolicyRegistry(storage).versions(tenant)] == ["v1"]
    assert not dead.finish(lost)
    assert heir.run_next() is None  # done: nothing more is wanted


def test_a_run_that_loses_its_claim_commits_nothing(storage: Storage) -> None:
    tenant = _logged_tenant(storage, "acme")
    trainer = ClusterTrainer(storage, FAST, failover_s=60, elect=False)
    trainer.queue.want(tenant, 1)
    original = trainer.queue.fence

    def fence_after_takeover(job: object, session: object) -> None:
        # Another trainer took the job over while this one was training.
        raise LeaseLost("taken over")

    trainer.queue.fence = fence_after_takeover  # type: ignore[method-assign]
    assert trainer.run_next() is None
    trainer.queue.fence = original  # type: ignore[method-assign]
    assert PolicyRegistry(storage).versions(tenant) == []
    assert PolicyRegistry(storage).history(tenant) == []


# -- shared rate limits ------------------------------------------------------------------------


def test_two_instances_share_one_bucket(storage: Storage, pg_url: str) -> None:
    tenant = storage.ensure_tenant("busy")
    a = SharedRateLimiter(pg_url, rate=1.0, burst=1000)
    b = SharedRateLimiter(pg_url, rate=1.0, burst=1000)
    try:
        assert a.take(tenant, 600) == 0.0
        # Only about 400 left, whichever instance asks; `a` holds a lease of 0.25 s of the rate.
        wait = b.take(tenant, 600)
        assert 190 < wait <= 200.25
        assert b.take(tenant, 300) == 0.0
        assert a.take(tenant, 300) > 0
    finally:
        a.close()
        b.close()


def test_leases_spare_round_trips_and_never_admit_more_than_the_bucket(
    storage: Storage, pg_url: str
) -> None:
    tenant = storage.ensure_tenant("leased")
    now = [0.0]  # the leases' clock; the bucket refills by the database's

    def limiter() -> SharedRateLimiter:
        # A lease is 0.25 s of the rate: 100 tokens beyond the batch.
        return SharedRateLimiter(pg_url, rate=400.0, burst=1000.0, clock=lambda: now[0])

    a, b = limiter(), limiter()
    try:
        started = time.monotonic()
        admitted = sum(50 for one in [a, b] * 8 if one.take(tenant, 50) == 0.0)
        refilled = 400.0 * (time.monotonic() - started)
        assert admitted == 800
        # Each instance went to the database on its 1st, 4th and 7th batch: 150 tokens each time.
        assert (a.statements, b.statements) == (3, 3)
        # 900 tokens taken: the bucket holds what is left, and nothing more was admitted.
        assert a.take(tenant, 1000 - 900 + refilled + 60) > 0
        # A lease lapses: the next batch goes to the database again.
        held = b.statements
        assert b.take(tenant, 50) == 0.0 and b.statements == held  # 50 left of its lease
        now[0] += 1.0
        b.take(tenant, 10)
        assert b.statements > held
    finally:
        a.close()
        b.close()


def test_a_bucket_too_low_for_a_lease_still_admits_the_batch(storage: Storage, pg_url: str) -> None:
    tenant = storage.ensure_tenant("nearly-spent")
    # Leases of 2 s at 100 tokens/s: 200 tokens beyond the batch.
    a = SharedRateLimiter(pg_url, rate=100.0, burst=1000.0, lease_s=2.0)
    b = SharedRateLimiter(pg_url, rate=100.0, burst=1000.0, lease_s=2.0)
    try:
        assert a.take(tenant, 800) == 0.0  # 800 and a lease of 200: the bucket is empty
        assert b.take(tenant, 50) > 0  # nothing for b until it refills (0.5 s)
        time.sleep(0.6)  # 60 tokens: the batch, not 250 for a lease too (that takes 2.5 s)
        held = b.statements
        assert b.take(tenant, 50) == 0.0
        assert b.statements == held + 2  # the lease refused, then the batch alone
    finally:
        a.close()
        b.close()


# -- real backend processes --------------------------------------------------------------------


def _start_backend(url: str, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    with bind_loopback() as probe:
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "backend.cli", "--port", str(port), "--db", url, *extra],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    wait_until_healthy(base, process, timeout=120)
    return process, base


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _wait_for_holder(storage: Storage, among: set[int], timeout: float) -> tuple[int, int]:
    """(pid, epoch) of the live trainer lease's holder once it is one of `among`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = lease_state(storage.engine, TRAINER_LEASE)
        if state is not None and state.live:
            pid = pid_of_holder(state.holder)
            if pid in among:
                return pid, state.epoch
        time.sleep(0.1)
    raise AssertionError(f"no live trainer among {among} within {timeout} s")


def test_the_trainer_fails_over_when_its_instance_is_killed(storage: Storage, pg_url: str) -> None:
    processes = [_start_backend(pg_url, "--failover", "3")[0] for _ in range(2)]
    try:
        pids = {process.pid for process in processes}
        leader, epoch = _wait_for_holder(storage, pids, timeout=60)
        os.kill(leader, signal.SIGKILL)
        heir, new_epoch = _wait_for_holder(storage, pids - {leader}, timeout=60)
        assert heir != leader and new_epoch == epoch + 1
        # Exactly one holder: the survivor renews, the dead one never comes back.
        state = lease_state(storage.engine, TRAINER_LEASE)
        assert state is not None and pid_of_holder(state.holder) == heir
    finally:
        _stop(processes)


def _batch(n: int) -> tuple[bytes, list[str]]:
    events = [OutcomeEvent(decision_id=uuid.uuid4().hex, kind="ignored") for _ in range(n)]
    body = json.dumps({"events": [json.loads(e.model_dump_json()) for e in events]}).encode()
    return body, [str(e.event_id) for e in events]


def test_the_same_batch_posted_to_two_instances_at_once_is_stored_once(
    storage: Storage, pg_url: str
) -> None:
    token = storage.create_token("twice")
    principal = storage.principal_for_token(token)
    assert principal is not None
    started = [_start_backend(pg_url) for _ in range(2)]
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    sent: list[str] = []
    accepted: list[str] = []
    duplicate: list[str] = []
    lock = threading.Lock()
    try:
        for _ in range(20):
            body, ids = _batch(100)
            sent += ids
            answers: list[httpx.Response] = []

            def post(
                base: str, body: bytes = body, answers: list[httpx.Response] = answers
            ) -> None:
                answer = httpx.post(f"{base}/v1/events", content=body, headers=headers, timeout=60)
                with lock:
                    answers.append(answer)

            threads = [threading.Thread(target=post, args=(base,)) for _, base in started]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            for answer in answers:
                assert answer.status_code == 200, answer.text
                accepted.extend(answer.json()["accepted"])
                duplicate.extend(answer.json()["duplicate"])
    finally:
        _stop([process for process, _ in started])

    # Each event was accepted by exactly one instance and reported a duplicate by the other.
    assert sorted(accepted) == sorted(sent)
    assert sorted(duplicate) == sorted(sent)
    with storage.session() as session:
        rows = session.execute(
            select(func.count(), func.count(StoredEvent.event_id.distinct())).where(
                StoredEvent.tenant_id == principal.tenant_id
            )
        ).one()
    assert tuple(rows) == (len(sent), len(sent))


def test_a_trainer_process_needs_postgresql(tmp_path: Path) -> None:
    from backend.cli import backend_main

    assert backend_main(["trainer", "--db", f"sqlite:///{tmp_path / 'b.sqlite3'}"]) == 2


def test_an_app_on_postgresql_stands_for_election_and_shares_its_limits(pg_url: str) -> None:
    from backend.app import create_app
    from backend.settings import BackendSettings

    app = create_app(
        BackendSettings(db_url=pg_url, train=True, failover_s=30.0, shared_rate_limits=True)
    )
    services = app.services
    try:
        assert services.trainer is None and services.cluster is not None
        assert isinstance(services.rate_limiter, SharedRateLimiter)
    finally:
        services.stop()


def test_a_failed_run_is_tried_again_after_a_claims_time(storage: Storage) -> None:
    tenant = storage.ensure_tenant("flaky")
    queue = JobQueue(storage.engine, "trainer", ttl_s=1)
    queue.want(tenant, 5)
    job = queue.claim()
    assert job is not None
    assert queue.finish(job, error="RuntimeError: out of memory")
    assert queue.claim() is None  # not at once: no tight retry loop
    _expire(storage, 1)
    again = queue.claim()
    assert again is not None and again.attempts == 2
    (row,) = queue.jobs()
    assert row["last_error"] == "RuntimeError: out of memory" and row["runs"] == 0
