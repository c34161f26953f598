"""Scheduled adapter training: on by default, off with `--adapter-every off`; a tenant without
enough new text-carrying events is skipped by one count, before any dataset or model; in one
process (SQLite) and as jobs claimed by trainers on a shared PostgreSQL database, where a killed
trainer's job is claimed again and resumes from its checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest
from sqlalchemy import event

import backend.adapters.run as adapter_run
import backend.adapters.scheduler as adapter_scheduler
import training.workspace
from backend.adapters.run import tenant_registry
from backend.adapters.scheduler import (
    DEFAULT_EVERY_S,
    NO_TEXT,
    TENANTS_METRIC,
    TOO_FEW,
    AdapterSchedule,
    AdapterScheduler,
    check_tenant,
)
from backend.cli import _serve_parser, _trainer_parser, adapter_schedule
from backend.local import LocalBackend
from backend.metrics import Metrics
from backend.policy.settings import TrainerSettings
from backend.scheduler import ClusterTrainer
from backend.services.container import BackendServices
from backend.settings import BackendSettings
from backend.storage import Storage
from tests.backend.adapters.events import logged, post
from tests.support.backend_server import BackendServer, postgres_database, postgres_url
from training.trainer import KILL_AT_STEP_ENV, TrainSettings

ROOT = Path(__file__).resolve().parents[3]
SMALL = TrainSettings(micro_batch=2, effective_batch=4, checkpoint_every=1, max_prompt_tokens=64)


def _schedule(model: Path, **over: object) -> AdapterSchedule:
    values: dict[str, object] = {
        "every_s": 3600,
        "min_new_events": 20,
        "budget_samples": 8,
        "model": str(model),
        "min_examples": 5,
        "eval_n": 2,
    }
    return AdapterSchedule.model_validate({**values, **over})


def test_on_by_default_and_off_with_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    default_schedule = adapter_schedule(_serve_parser().parse_args([]))
    assert default_schedule.enabled and default_schedule.every_s == DEFAULT_EVERY_S == 3600
    on = adapter_schedule(_serve_parser().parse_args(["--adapter-every", "6h"]))
    assert on.enabled and on.every_s == 6 * 3600
    for off in ("off", "0", "OFF"):
        assert not adapter_schedule(_serve_parser().parse_args(["--adapter-every", off])).enabled
    trainer = _trainer_parser().parse_args(["--adapters", "--adapter-samples", "64"])
    assert trainer.adapters and adapter_schedule(trainer).budget_samples == 64
    assert default_schedule.blob_url is None  # adapter-blobs/ in the cache directory
    monkeypatch.setenv("TABLOOP_BACKEND_ADAPTERS__BLOB_URL", "s3://team/adapters")
    assert adapter_schedule(_trainer_parser().parse_args(["--adapters"])).blob_url == (
        "s3://team/adapters"
    )
    flagged = _serve_parser().parse_args(["--adapter-blob-url", str(tmp_path / "blobs")])
    assert adapter_schedule(flagged).blob_url == str(tmp_path / "blobs")
    monkeypatch.delenv("TABLOOP_BACKEND_ADAPTERS__BLOB_URL")
    for bad in ("often", "-1h"):
        with pytest.raises(SystemExit):
            _serve_parser().parse_args(["--adapter-every", bad])
    with pytest.raises(ValueError):
        AdapterSchedule.model_validate({"every_s": -1})
    # The environment turns it off too; a flag given wins over it.
    monkeypatch.setenv("TABLOOP_BACKEND_ADAPTERS__EVERY_S", "off")
    assert not BackendSettings().adapters.enabled
    assert adapter_schedule(_serve_parser().parse_args(["--adapter-every", "2h"])).enabled
    monkeypatch.delenv("TABLOOP_BACKEND_ADAPTERS__EVERY_S")

    storage = Storage(f"sqlite:///{tmp_path / 'db.sqlite3'}")
    try:
        default = BackendServices.create(BackendSettings(train=True, cache_dir=tmp_path), storage)
        assert isinstance(default.adapters, AdapterScheduler)
        assert default.adapters.schedule.every_s == DEFAULT_EVERY_S
        turned_off = BackendServices.create(
            BackendSettings(train=True, cache_dir=tmp_path, adapters=AdapterSchedule.off()),
            storage,
        )
        assert turned_off.adapters is None
        # Only the process that trains schedules adapters.
        serving_only = BackendServices.create(BackendSettings(cache_dir=tmp_path), storage)
        assert serving_only.adapters is None
    finally:
        storage.close()


def _events_queries(storage: Storage) -> list[str]:
    """Every statement on the events table from now on (a listener on the engine)."""
    statements: list[str] = []

    def record(*args: Any) -> None:
        statement = args[2]
        if " events" in statement:
            statements.append(statement)

    event.listen(storage.engine, "before_cursor_execute", record)
    return statements


def _no_training(monkeypatch: pytest.MonkeyPatch, tenant: str | None = None) -> None:
    """Building a dataset or training fails the test loudly: any tenant's, or `tenant`'s only
    (a shared PostgreSQL database holds the tenants of earlier tests, which may be due)."""

    def refuse(*_args: object, **_kwargs: object) -> NoReturn:
        pytest.fail("a skipped tenant must not get a dataset or a run")

    def train_tenant(_storage: object, name: str, *_args: object, **_kwargs: object) -> Any:
        if tenant is None or name == tenant:
            refuse()
        return {"tenant": name, "skipped": "another test's tenant"}

    monkeypatch.setattr(adapter_scheduler, "train_tenant", train_tenant)
    monkeypatch.setattr(adapter_run, "TenantExamples", refuse)
    monkeypatch.setattr(training.workspace, "load_trainable", refuse)


def test_a_tenant_without_text_is_skipped_by_one_count_and_counted(
    backend: BackendServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_training(monkeypatch, backend.tenant)
    schedule = AdapterSchedule.model_validate({"min_new_events": 20})  # the default model
    silent = [replace(item, action="silence") for item in logged(30)]  # text, but not shown
    post(backend, logged(600, text=False) + silent)  # more rows than a page
    metrics = Metrics()
    scheduler = AdapterScheduler(backend.storage, schedule, tmp_path, metrics=metrics)
    mine = [(backend.tenant_id, backend.tenant)]
    queries = _events_queries(backend.storage)

    check = check_tenant(backend.storage, backend.tenant_id, backend.tenant, tmp_path, schedule)
    assert (check.reason, check.new_text_events, check.due) == (NO_TEXT, 0, False)
    assert len(queries) == 1, queries  # one count, whatever the number of rows

    assert [r for r in scheduler.run_once() if r["tenant"] == backend.tenant] == []
    assert scheduler.last_pass is not None and scheduler.skipped[NO_TEXT] >= 1
    assert metrics.value(TENANTS_METRIC, result=NO_TEXT) >= 1
    assert "skipped" in scheduler.last_pass.summary()
    # A shared PostgreSQL database also holds earlier tests' tenants: each pass counts them too.
    others_too_few = metrics.value(TENANTS_METRIC, result=TOO_FEW)

    # A few text-carrying events: still skipped, by the other reason; enough: due.
    post(backend, logged(5))
    check = check_tenant(backend.storage, backend.tenant_id, backend.tenant, tmp_path, schedule)
    assert (check.reason, check.new_text_events) == (TOO_FEW, 5)
    counted = metrics.value(TENANTS_METRIC, result=TOO_FEW)
    assert counted == others_too_few  # check_tenant counts nothing
    assert mine[0] not in scheduler.due()
    assert metrics.value(TENANTS_METRIC, result=TOO_FEW) == counted + others_too_few + 1
    post(backend, logged(15))
    assert mine[0] in scheduler.due()


def test_a_backend_trains_by_default_and_skips_a_tenant_without_text_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_training(monkeypatch)
    settings = BackendSettings(train=True, cache_dir=tmp_path / "cache")
    with LocalBackend(f"sqlite:///{tmp_path / 'db.sqlite3'}", settings=settings) as local:
        scheduler = local.services.adapters
        assert isinstance(scheduler, AdapterScheduler)  # on without being asked
        deadline = time.monotonic() + 30  # the first pass runs at start
        while scheduler.last_pass is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert scheduler.last_pass is not None, "no pass at start"
        assert scheduler.last_pass.skipped == {NO_TEXT: 1}
        text = httpx.get(local.url + "/metrics", timeout=10).text
        assert f'{TENANTS_METRIC}{{result="{NO_TEXT}"}} 1' in text


def test_a_tenant_is_due_after_enough_new_text_events_and_trained(
    sqlite_backend: BackendServer, tiny_model_path: Path, tmp_path: Path
) -> None:
    schedule = _schedule(tiny_model_path)
    storage = sqlite_backend.storage
    tenant, tenant_id = sqlite_backend.tenant, sqlite_backend.tenant_id
    scheduler = AdapterScheduler(storage, schedule, tmp_path, SMALL)
    post(sqlite_backend, logged(15) + logged(30, text=False))  # text-less events do not count
    assert scheduler.due() == []
    post(sqlite_backend, logged(10))
    assert scheduler.due() == [(tenant_id, tenant)]

    reports = scheduler.run_once()
    assert [r["version"] for r in reports] == ["v0001"], reports
    registry = tenant_registry(storage, tmp_path, tenant)
    (version,) = registry.versions()
    assert version.evaluation is not None and version.train["through_event_id"] > 0
    # Nothing new since the run: not due until enough new text-carrying events arrive.
    assert not check_tenant(storage, tenant_id, tenant, tmp_path, schedule).due
    post(sqlite_backend, logged(19))
    assert not check_tenant(storage, tenant_id, tenant, tmp_path, schedule).due
    post(sqlite_backend, logged(1))
    assert check_tenant(storage, tenant_id, tenant, tmp_path, schedule).due


def test_a_tenant_without_text_is_never_due(
    sqlite_backend: BackendServer, tiny_model_path: Path, tmp_path: Path
) -> None:
    post(sqlite_backend, logged(60, text=False))
    scheduler = AdapterScheduler(sqlite_backend.storage, _schedule(tiny_model_path), tmp_path)
    assert scheduler.due() == [] and scheduler.run_once() == []


@pytest.fixture
def fresh_postgres() -> Iterator[str]:
    """A database of its own: the scheduler looks at every tenant in it."""
    if postgres_url() is None:
        pytest.skip("TABLOOP_TEST_POSTGRES_URL is not set (.ci/run starts PostgreSQL)")
    with postgres_database() as url:
        yield url


def test_cluster_jobs_are_claimed_and_a_killed_trainers_job_resumes(
    fresh_postgres: str, tiny_model_path: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    with BackendServer(fresh_postgres) as backend:
        post(backend, logged(70))  # 56 to train on: above the default --min-examples (50)
        tenant = backend.tenant
    storage = Storage(fresh_postgres)
    try:
        schedule = _schedule(tiny_model_path, min_new_events=30, budget_samples=8 * 23)
        # Its claims last 200 s: the run below (its evaluation converts the model and the
        # adapter for the fast engine, some 45 s on a busy 2-core machine) ends within them
        # without a heartbeat.
        leader = ClusterTrainer(
            storage, TrainerSettings(), failover_s=300, adapters=schedule, cache_dir=cache
        )
        assert leader.schedule_adapters() == 1
        assert leader.adapter_queue is not None
        (job,) = leader.adapter_queue.jobs()
        assert job["wanted_event_id"] > job["done_event_id"] == 0

        # A trainer on "another machine" claims the job and dies part-way into step 22; its
        # checkpoint of step 20 is in the shared cache directory.
        command = [
            sys.executable, "-m", "tabloop", "backend", "trainer", "--db", fresh_postgres,
            "--failover", "3", "--adapters", "--adapter-model", str(tiny_model_path),
            "--adapter-samples", str(8 * 23), "--adapter-min-events", "30",
        ]  # fmt: skip
        env = {
            **os.environ,
            "TABLOOP_CACHE_DIR": str(cache),
            "PYTHONPATH": str(ROOT),
            KILL_AT_STEP_ENV: "22",
        }
        dead = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert dead.returncode == -signal.SIGKILL, dead.stderr[-2000:]
        (job,) = leader.adapter_queue.jobs()
        assert job["claimed_by"] is not None and job["runs"] == 0
        # Claimed again once the dead trainer's claim has expired (2 s), and resumed.
        deadline = time.monotonic() + 60
        report = leader.run_next_adapter()
        while report is None and time.monotonic() < deadline:
            time.sleep(0.5)
            report = leader.run_next_adapter()
        assert report is not None
        assert report["version"] == "v0001", json.dumps(report)[:2000]
        assert report["training"]["resumed_from_step"] == 20
        assert report["training"]["steps"] == 23
        (job,) = leader.adapter_queue.jobs()
        assert job["runs"] == 1 and job["claimed_by"] is None
        assert job["done_event_id"] == job["wanted_event_id"]
        registry = tenant_registry(storage, cache, tenant)
        assert [v.name for v in registry.versions()] == ["v0001"]
        # Nothing new: no job is wanted again.
        assert leader.schedule_adapters() == 0
    finally:
        storage.close()
