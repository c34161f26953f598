"""The background syncer, the workspace secret, and `tabloop index --sync`."""

from __future__ import annotations

import json
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from indexer.cli import index_main
from indexer.service import WorkspaceIndex
from indexer.sync_keys import load_or_create_secret
from indexer.sync_setup import syncer_for_index
from tests.indexer.conftest import copy_stdlib, quiet_settings
from tests.support.backend_server import BackendServer
from tests.support.embedders import HashingEmbedder
from tests.support.fixtures import tiny_embedder_path


def test_the_secret_is_created_once_and_private(tmp_path: Path) -> None:
    secret = load_or_create_secret(tmp_path / "sync")
    assert len(secret) == 64
    mode = stat.S_IMODE((tmp_path / "sync" / "secret").stat().st_mode)
    assert mode == 0o600
    assert load_or_create_secret(tmp_path / "sync") == secret
    assert load_or_create_secret(tmp_path / "other") != secret


def _until(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_the_syncer_follows_the_index_and_outlives_an_outage(
    sqlite_backend: BackendServer, tmp_path: Path
) -> None:
    root = copy_stdlib(tmp_path / "ws", ("bisect.py", "colorsys.py"))
    index = WorkspaceIndex(root, quiet_settings(), tmp_path / "cache", embedder=HashingEmbedder())
    index.start()
    assert index.wait_idle(60)
    syncer = syncer_for_index(
        index,
        sqlite_backend.url,
        sqlite_backend.token,
        debounce_s=0.2,
        interval_s=0,
        poll_s=0.05,
        backoff_initial_s=0.1,
        backoff_max_s=0.5,
    )
    syncer.client.retry_deadline_s = 0.5

    def local_root() -> bytes | None:
        return index.indexer.tree.root_hash if index.indexer else None

    try:
        syncer.start()
        assert _until(lambda: syncer.synced_local_root == local_root()), syncer.status()
        first = syncer.last_report
        assert first is not None and first.files_uploaded == 2

        # A local edit reaches the server after the debounce, without anyone asking.
        index.update_document(root / "bisect.py", "def bisect_everything():\n    pass\n")
        assert index.wait_idle(30)
        assert _until(lambda: syncer.synced_local_root == local_root()), syncer.status()
        assert syncer.last_report is not None and syncer.last_report.files_uploaded == 1

        # The backend goes away: sync attempts fail and back off, search goes on.
        sqlite_backend.stop_serving()
        index.update_document(root / "colorsys.py", "def colour_of_nothing():\n    pass\n")
        assert index.wait_idle(30)
        assert _until(lambda: syncer.failures >= 2), syncer.status()
        assert syncer.synced_local_root != local_root()
        assert index.search("colour of nothing", k=1)[0].path == "colorsys.py"
        assert syncer.sync_now(timeout=30) is None and syncer.last_error

        sqlite_backend.start_serving()
        assert _until(lambda: syncer.synced_local_root == local_root()), syncer.status()
        report = syncer.sync_now(timeout=30)
        assert report is not None and report.in_sync_before
    finally:
        syncer.close()
        index.close()


@pytest.fixture(scope="module")
def tiny_embedder_dir() -> Path:
    return tiny_embedder_path()


def test_index_sync_command_lets_a_fresh_clone_embed_nothing(
    sqlite_backend: BackendServer,
    tmp_path: Path,
    tiny_embedder_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TABLOOP_INDEX__SYNC_SECRET", "shared by the team")
    first = copy_stdlib(tmp_path / "alice", ("bisect.py", "colorsys.py", "fnmatch.py"))
    common = ["--sync", "--backend-url", sqlite_backend.url, "--token", sqlite_backend.token]
    common += ["--json", "--no-progress", "--model", str(tiny_embedder_dir)]
    assert index_main([str(first), "--cache-dir", str(tmp_path / "c1"), *common]) == 0
    alice = json.loads(capsys.readouterr().out)
    assert alice["chunks_total"] >= alice["chunks_embedded"] > 5  # equal text: one vector
    assert alice["reuse"]["fetched"] == 0
    assert alice["sync"]["vectors_uploaded"] == alice["chunks_embedded"]

    clone = tmp_path / "bob"
    shutil.copytree(first, clone)
    assert index_main([str(clone), "--cache-dir", str(tmp_path / "c2"), *common]) == 0
    bob = json.loads(capsys.readouterr().out)
    assert bob["reuse"]["fetched"] == alice["chunks_embedded"]
    assert bob["chunks_total"] == alice["chunks_total"]
    assert bob["chunks_embedded"] == 0
    assert bob["sync"]["vectors_uploaded"] == 0  # the tenant already had every vector
    assert bob["sync"]["vectors_reused"] == alice["chunks_embedded"]


def test_index_sync_command_needs_a_backend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TABLOOP_TELEMETRY__BACKEND_URL", raising=False)
    root = copy_stdlib(tmp_path / "ws", ("bisect.py",))
    code = index_main([str(root), "--sync", "--cache-dir", str(tmp_path / "c"), "--no-progress"])
    assert code == 1
    assert "--backend-url" in capsys.readouterr().err
    assert not list((tmp_path / "c").rglob("*"))  # refused before anything was written
