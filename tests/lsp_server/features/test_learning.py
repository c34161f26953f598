"""The server keeps feedback locally."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from completion.types import CompletionRequest, Decision
from lsp_server.features.learning import LearningFeature
from telemetry.events import OutcomeEvent
from tests.support.feature_server import feature_server
from training.feedback import DISTRACTION_SHARE, FeedbackRecorder


def _outcome(kind: str, decision_id: str = "d1", chars: int | None = None) -> OutcomeEvent:
    return OutcomeEvent(decision_id=decision_id, kind=kind, accepted_chars=chars)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("event", "reward"),
    [
        pytest.param(_outcome("accepted", chars=10), 1.0, id="accepted"),
        pytest.param(_outcome("partial", chars=5), 0.5, id="partial"),
        pytest.param(_outcome("ignored"), -DISTRACTION_SHARE, id="ignored"),
        pytest.param(_outcome("dismissed"), -DISTRACTION_SHARE, id="dismissed"),
        pytest.param(_outcome("superseded"), None, id="superseded"),
        pytest.param(_outcome("not_viewed"), None, id="not-viewed"),
    ],
)
def test_an_outcome_settles_its_shown_suggestion(event: OutcomeEvent, reward: float | None) -> None:
    recorder = FeedbackRecorder()
    request = CompletionRequest(prefix="x = ", suffix="\n", language="python", path="a.py")
    recorder.shown(_decision("d1", "0123456789"), request)
    kept = recorder.settled(event)
    if reward is None:  # an outcome that judges nothing keeps nothing
        assert kept is None
        return
    assert kept is not None
    assert (kept.outcome, kept.reward, kept.propensity) == (event.kind, reward, 0.8)
    assert (kept.prefix, kept.suggestion, kept.suffix, kept.path) == (
        "x = ",
        "0123456789",
        "\n",
        "a.py",
    )
    # What the user kept: the accepted text (the whole, or the share taken); nothing otherwise.
    assert kept.kept == {"accepted": "0123456789", "partial": "01234"}.get(event.kind)
    assert kept.decision_id == "d1"
    assert recorder.settled(event) is None  # once


def test_the_recorder_forgets_the_oldest_unsettled_and_the_unshown() -> None:
    recorder = FeedbackRecorder(kept=2)
    request = CompletionRequest(prefix="x = ", suffix="", language="python", path="a.py")
    recorder.shown(_decision("silent", "y", action="silence"), request)
    for name in ("d1", "d2", "d3"):
        recorder.shown(_decision(name, "y"), request)
    assert recorder.settled(_outcome("accepted", "silent", 1)) is None
    assert recorder.settled(_outcome("accepted", "d1", 1)) is None
    assert recorder.settled(_outcome("accepted", "d3", 1)) is not None


def _decision(decision_id: str, text: str, action: str = "show") -> Decision:
    return Decision(decision_id=decision_id, action=action, text=text, propensity=0.8)  # type: ignore[arg-type]


async def test_shown_suggestions_and_their_outcomes_are_kept(tmp_path: Path) -> None:
    server = feature_server(tmp_path)
    feature = LearningFeature(server)  # type: ignore[arg-type]
    feature.on_settings(server.settings)
    request = CompletionRequest(prefix="x = ", suffix="\n", language="python", path="a.py")
    feature.on_decision(_decision("d1", "compute()"), request)
    feature.on_decision(_decision("d2", "other()"), request)
    feature.on_decision(_decision("d3", "", "silence"), request)
    feature.on_outcome(_outcome("accepted", "d1", chars=9))
    feature.on_outcome(_outcome("superseded", "d2"))
    feature.on_outcome(_outcome("ignored", "d3"))
    await asyncio.sleep(0.05)
    for _ in range(100):  # the insert runs in a worker thread
        if feature.store is not None and feature.store.count():
            break
        await asyncio.sleep(0.05)
    assert feature.store is not None
    rows = list(feature.store.rows(feature.store.last_id()))
    assert [(r.suggestion, r.outcome, r.reward, r.propensity) for r in rows] == [
        ("compute()", "accepted", 1.0, 0.8)
    ]
    assert rows[0].prefix == "x = " and rows[0].path == "a.py"
    assert feature.store.path.is_relative_to(tmp_path / "cache")
    assert feature.store.workspace == str((tmp_path / "ws").resolve())
    assert rows[0].kept == "compute()"
    feature.on_kept("d1", "compute(2)")  # the user's edit, at the first retention checkpoint
    for _ in range(100):  # the update runs in a worker thread
        kept = [r.kept for r in feature.store.rows(feature.store.last_id())]
        if kept == ["compute(2)"]:
            break
        await asyncio.sleep(0.02)
    assert kept == ["compute(2)"]
    feature.on_shutdown()


async def _kept(feature: LearningFeature, decision_id: str, text: str) -> None:
    request = CompletionRequest(prefix="x = ", suffix="\n", language="python", path="a.py")
    feature.on_decision(_decision(decision_id, text), request)
    before = feature.store.count() if feature.store is not None else 0
    feature.on_outcome(_outcome("accepted", decision_id, chars=len(text)))
    for _ in range(100):  # the insert runs in a worker thread
        if feature.store is not None and feature.store.count() > before:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("not kept")


async def test_feedback_is_kept_under_the_servers_workspace(tmp_path: Path) -> None:
    """Two servers (two workspaces) share the cache's store; each reads only its own rows."""
    first, second = feature_server(tmp_path), feature_server(tmp_path)
    second.workspace_root = tmp_path / "other"
    features = [LearningFeature(server) for server in (first, second)]  # type: ignore[arg-type]
    for feature, server in zip(features, (first, second), strict=True):
        feature.on_settings(server.settings)
    await _kept(features[0], "d1", "mine()")
    await _kept(features[1], "d2", "theirs()")
    await _kept(features[1], "d3", "theirs_too()")
    stores = [feature.store for feature in features]
    assert stores[0] is not None and stores[1] is not None
    assert stores[0].path == stores[1].path
    assert [r.suggestion for r in stores[0].rows(10**6)] == ["mine()"]
    assert [r.suggestion for r in stores[1].rows(10**6)] == ["theirs()", "theirs_too()"]
    for feature in features:
        feature.on_shutdown()


def test_no_store_when_turned_off(tmp_path: Path) -> None:
    server = feature_server(tmp_path, rows=0)
    feature = LearningFeature(server)  # type: ignore[arg-type]
    feature.on_settings(server.settings)
    assert feature.store is None


def test_no_store_without_a_workspace_root(tmp_path: Path) -> None:
    server = feature_server(tmp_path)
    server.workspace_root = None
    feature = LearningFeature(server)  # type: ignore[arg-type]
    feature.on_settings(server.settings)
    assert feature.store is None
