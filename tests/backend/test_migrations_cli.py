"""Schema migrations and the `tabloop backend` command line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from backend.cli import backend_main
from backend.db.migrate import current_revision, head_revision, upgrade
from backend.db.models import Base
from backend.local import bind_loopback, wait_until_healthy
from backend.storage import Storage
from tabloop.cli import main as tabloop_main

ROOT = Path(__file__).resolve().parents[2]


def test_migrations_reach_head_and_match_the_models(db_url: str) -> None:
    storage = Storage(db_url)
    try:
        upgrade(storage.engine)  # a second run changes nothing
        assert current_revision(storage.engine) == head_revision()
        with storage.engine.connect() as connection:
            differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
        assert differences == []
    finally:
        storage.close()


def test_token_create_prints_a_working_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'b.sqlite3'}"
    assert backend_main(["token", "create", "--tenant", "acme", "--db", url]) == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("tl_")
    storage = Storage(url)
    try:
        principal = storage.principal_for_token(token)
        assert principal is not None and principal.tenant == "acme"
        with storage.engine.connect() as connection:
            stored = connection.exec_driver_sql("SELECT token_hash FROM api_tokens").scalars().all()
        assert token not in stored  # only the hash is kept
    finally:
        storage.close()
    # The top-level CLI delegates to the same entry point.
    assert tabloop_main(["backend", "token", "revoke", token, "--db", url]) == 0
    assert backend_main(["token", "revoke", token, "--db", url]) == 1


def test_token_create_refuses_an_empty_tenant(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'b.sqlite3'}"
    assert backend_main(["token", "create", "--tenant", "", "--db", url]) == 2


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("acme corp", id="space"),
        pytest.param("acme\tcorp", id="tab"),
        pytest.param("acme\n", id="newline"),
        pytest.param("acme\x00", id="nul"),
        pytest.param("acme\x7f", id="del"),
        pytest.param("acme\u00a0corp", id="no-break-space"),
        pytest.param("ac\u200bme", id="zero-width-space"),
        pytest.param("acme\u2028", id="line-separator"),
    ],
)
def test_token_create_refuses_whitespace_and_control_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    url = f"sqlite:///{tmp_path / 'b.sqlite3'}"
    assert backend_main(["token", "create", "--tenant", name, "--db", url]) == 2
    assert "whitespace or control" in capsys.readouterr().err
    storage = Storage(url)
    try:
        with storage.engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT count(*) FROM tenants").scalar() == 0
    finally:
        storage.close()


def test_serve_runs_migrates_and_stops_on_sigterm(tmp_path: Path) -> None:
    with bind_loopback() as probe:
        port = probe.getsockname()[1]
    db = tmp_path / "served.sqlite3"
    process = subprocess.Popen(
        [sys.executable, "-m", "backend.cli", "--port", str(port), "--db", f"sqlite:///{db}"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until_healthy(f"http://127.0.0.1:{port}", process, timeout=60)
        assert httpx.post(f"http://127.0.0.1:{port}/v1/events", content=b"{}").status_code == 401
    finally:
        process.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught.
        assert process.wait(30) in (0, -signal.SIGTERM)
        errors = process.stderr.read().decode() if process.stderr else ""
        assert "Traceback" not in errors, errors
    storage = Storage(f"sqlite:///{db}", migrate=False)
    try:
        assert current_revision(storage.engine) == head_revision()
    finally:
        storage.close()
