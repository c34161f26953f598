"""Features find each other by class; status gathers their parts."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from lsp_server.features import create_server
from lsp_server.features.index import IndexFeature
from lsp_server.features.policy import PolicyFeature
from lsp_server.features.telemetry import TelemetryFeature
from lsp_server.retrieval import WorkspaceContext
from lsp_server.server import ModelThread, TabloopServer


class Part:
    def status_parts(self) -> dict[str, Any]:
        return {"part": {"ok": True}}


class SpecialPart(Part):
    pass


def test_every_feature_is_found_by_its_class() -> None:
    server = create_server()
    assert isinstance(server.feature_of(IndexFeature), IndexFeature)
    assert isinstance(server.feature_of(PolicyFeature), PolicyFeature)
    assert isinstance(server.feature_of(TelemetryFeature), TelemetryFeature)
    assert isinstance(server.feature_of(WorkspaceContext), WorkspaceContext)


def test_a_missing_feature_is_a_lookup_error() -> None:
    server = TabloopServer()
    assert server.find_feature(IndexFeature) is None
    with pytest.raises(LookupError, match="IndexFeature"):
        server.feature_of(IndexFeature)


def test_one_object_per_class_and_subclasses_are_found() -> None:
    server = TabloopServer()
    special = server.add_feature(SpecialPart())
    assert server.feature_of(Part) is special
    with pytest.raises(ValueError):
        server.add_feature(SpecialPart())


def test_status_gathers_the_features_parts() -> None:
    server = create_server()
    server.add_feature(Part())
    status = server.status()
    assert status["part"] == {"ok": True}  # type: ignore[typeddict-item]
    assert status["context"] == {"recentEdits": 0}
    assert status["telemetry"] == {"level": "off"}  # no client before the settings arrive
    assert "index" not in status  # not started


def test_a_screen_file_that_cannot_be_read_is_shown_as_a_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = create_server()
    shown: list[str] = []
    monkeypatch.setattr(server, "show_message", lambda message, kind: shown.append(message))
    missing = tmp_path / "screen.json"
    server.init_options = {"cacheDir": str(tmp_path), "nextEdit": {"screenWeights": str(missing)}}
    server.resolve_settings()
    assert len(shown) == 1
    assert "nextEdit.screenWeights: cannot read the screen" in shown[0] and str(missing) in shown[0]
    # The screen off, its file is not read (another missing one would be a new problem).
    server.init_options["nextEdit"] = {"screenWeights": str(tmp_path / "other.json")}
    server.init_options["nextEdit"]["screenBelow"] = 0
    server.resolve_settings()
    assert len(shown) == 1


def test_the_model_thread_counts_its_jobs_queued_and_running() -> None:
    thread = ModelThread()
    release = threading.Event()
    try:
        running = thread.submit(release.wait, 30)
        queued = thread.submit(lambda: 1 / 0)  # fails when its turn comes
        assert thread.jobs == 2
        release.set()
        assert running.result(timeout=30) is True
        with pytest.raises(ZeroDivisionError):
            queued.result(timeout=30)
        assert thread.jobs == 0
    finally:
        release.set()
        thread.shutdown(wait=True)
    with pytest.raises(RuntimeError):  # after shutdown: refused, and not counted
        thread.submit(print)
    assert thread.jobs == 0
