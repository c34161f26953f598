"""The event schema and privacy levels, without a server."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pydantic import ValidationError

from completion.types import LATENCY_SKIP, CompletionRequest, Decision, Timings
from lsp_server.features.telemetry import decision_event
from telemetry.events import (
    DecisionEvent,
    NextEditEvent,
    OutcomeEvent,
    RetentionEvent,
    parse_event,
)
from telemetry.privacy import apply_level, effective_level, scrub_features, scrub_model_id

SECRET_PREFIX = "def launch_codes_7f3a(key):\n    return "
SECRET_TEXT = "key.rotate_secret_7f3a()"


def engine_decision(**over: Any) -> tuple[Decision, CompletionRequest]:
    request = CompletionRequest(
        prefix=SECRET_PREFIX,
        suffix="\n",
        language="python",
        path="/home/me/secret_project_7f3a/app.py",
        uri="file:///home/me/secret_project_7f3a/app.py",
    )
    values: dict[str, Any] = {
        "decision_id": "a" * 32,
        "action": "show",
        "text": SECRET_TEXT,
        "propensity": 0.9,
        "policy_version": "builtin-3",
        "model_id": "/home/me/secret_project_7f3a/models/tiny",
        "features": {"language": "python", "cursor_column": 11.0, "mid_word": 0.0},
        "timings": Timings(context_ms=1.5, model_ms=30.0, total_ms=32.0),
        **over,
    }
    return Decision(**values), request


@pytest.mark.parametrize(
    ("level", "has_text"),
    [pytest.param("metrics", False, id="metrics"), pytest.param("full", True, id="full")],
)
def test_decision_event_carries_text_only_at_full(level: str, has_text: bool) -> None:
    decision, request = engine_decision()
    event = decision_event(decision, request, session_id="s", install_id="i", level=level)  # type: ignore[arg-type]
    recorded = apply_level(event, level)  # type: ignore[arg-type]
    assert recorded is not None
    body = recorded.model_dump_json()
    assert ("launch_codes_7f3a" in body) is has_text
    assert ("rotate_secret_7f3a" in body) is has_text
    if level == "metrics":
        assert "secret_project_7f3a" not in body  # the model path too
    assert recorded.suggestion_chars == len(SECRET_TEXT)
    assert recorded.latency.model_ms == 30.0


@pytest.mark.parametrize(
    "features",
    [
        pytest.param({"bad name with spaces": 1.0}, id="bad-name"),
        pytest.param({"x": math.nan, "y": math.inf}, id="non-finite"),
        pytest.param({"token": "Has Capitals And Spaces"}, id="not-a-category"),
        pytest.param({"flag": True}, id="bool"),
        pytest.param({f"f{i}": 1.0 for i in range(100)}, id="many"),
        pytest.param({"huge": 1e12, "tiny": -1e300}, id="beyond-the-schema-bound"),
    ],
)
@pytest.mark.parametrize("propensity", [pytest.param(1.7, id="above-1"), pytest.param(0.0, id="0")])
def test_decision_event_never_fails_on_odd_features(
    features: dict[str, Any], propensity: float
) -> None:
    decision, request = engine_decision(
        features=features, propensity=propensity, timings=Timings(model_ms=math.nan)
    )
    event = decision_event(decision, request, session_id="s", install_id="i", level="metrics")
    assert 0.0 < event.propensity <= 1.0
    assert all(isinstance(v, str) or math.isfinite(v) for v in event.features.values())
    assert "bad name with spaces" not in event.features
    parse_event(event.model_dump(mode="json"))  # what the backend will accept


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(3, 3.0, id="int"),
        pytest.param(True, 1.0, id="bool"),
        pytest.param("python", "python", id="category"),
        pytest.param("after_dot", "after_dot", id="category-underscore"),
        pytest.param("MyClassName", "other", id="identifier"),
        pytest.param("x = 1", "other", id="code"),
        pytest.param("/etc/passwd", "other", id="path"),
        pytest.param("a" * 40, "other", id="too-long"),
    ],
)
def test_scrub_features(value: Any, expected: Any) -> None:
    assert scrub_features({"f": value}) == {"f": expected}


@pytest.mark.parametrize(
    ("model_id", "kept"),
    [
        pytest.param("Qwen/Qwen2.5-Coder-0.5B", True, id="hub-id"),
        pytest.param("bundled", True, id="bundled"),
        pytest.param("/home/me/models/x", False, id="absolute-path"),
        pytest.param("~/models/x", False, id="home-path"),
        pytest.param("./models/x", False, id="relative-path"),
        pytest.param("C:\\models\\x", False, id="windows-path"),
        pytest.param("model.gguf", False, id="gguf-file"),
    ],
)
def test_scrub_model_id(model_id: str, kept: bool) -> None:
    scrubbed = scrub_model_id(model_id)
    assert (scrubbed == model_id) is kept
    if not kept:
        assert scrubbed.startswith("local:") and scrubbed == scrub_model_id(model_id)


@pytest.mark.parametrize(
    ("configured", "client_enabled", "level"),
    [
        pytest.param("full", True, "full", id="full"),
        pytest.param("full", False, "off", id="editor-off-wins"),
        pytest.param("off", True, "off", id="off"),
    ],
)
def test_effective_level(configured: str, client_enabled: bool, level: str) -> None:
    assert effective_level(configured, client_enabled) == level  # type: ignore[arg-type]


def test_off_records_nothing_and_other_events_pass_unchanged() -> None:
    outcome = OutcomeEvent(decision_id="d", kind="dismissed")
    assert apply_level(outcome, "off") is None
    assert apply_level(outcome, "metrics") is outcome


@pytest.mark.parametrize(
    "data",
    [
        pytest.param({"type": "outcome", "decision_id": "d", "kind": "accepted"}, id="no-chars"),
        pytest.param(
            {
                "type": "retention",
                "decision_id": "d",
                "after_s": 45,
                "accepted_chars": 1,
                "retained_chars": 1,
            },
            id="bad-checkpoint",
        ),
        pytest.param({"type": "outcome", "decision_id": "has space", "kind": "ignored"}, id="id"),
        pytest.param(
            {"type": "outcome", "decision_id": "d", "kind": "ignored", "x": 1}, id="extra"
        ),
    ],
)
def test_schema_rejects(data: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        parse_event(data)


def test_events_round_trip_through_json() -> None:
    for event in (
        OutcomeEvent(decision_id="d", kind="partial", accepted_chars=3),
        RetentionEvent(decision_id="d", after_s=600, accepted_chars=3, retained_chars=2),
        DecisionEvent(
            decision_id="d",
            session_id="s",
            install_id="i",
            language="go",
            trigger="invoked",
            policy_version="v1",
            model_id="m",
            action="silence",
            propensity=0.2,
        ),
    ):
        assert parse_event(event.model_dump(mode="json")) == event


@pytest.mark.parametrize(
    ("action", "text", "reason", "expected"),
    [
        pytest.param("silence", "x = 1", "silence", "policy", id="policy"),
        pytest.param(
            "silence", "", "it only repeats the code after the cursor", "empty", id="empty"
        ),
        pytest.param("silence", "", LATENCY_SKIP, "latency", id="latency"),
        pytest.param("show", "x = 1", "show", None, id="shown"),
    ],
)
def test_silences_say_why(action: str, text: str, reason: str, expected: str | None) -> None:
    decision, request = engine_decision()
    decision.action, decision.text, decision.reason = action, text, reason  # type: ignore[assignment]
    event = decision_event(decision, request, session_id="s", install_id="i", level="metrics")
    assert event.silence_reason == expected
    assert parse_event(event.model_dump(mode="json")).silence_reason == expected  # type: ignore[union-attr]


def test_candidates_carry_their_request_rank_and_count() -> None:
    decision, request = engine_decision()
    decision.request_id = decision.decision_id
    decision.rank = 2
    event = decision_event(
        decision, request, session_id="s", install_id="i", level="metrics", candidates=3
    )
    assert (event.request_id, event.rank, event.candidates) == (decision.decision_id, 2, 3)
    decision.rank = 0
    single = decision_event(decision, request, session_id="s", install_id="i", level="metrics")
    assert single.request_id is None and single.candidates == 1


def _next_edit(**over: Any) -> NextEditEvent:
    fields: dict[str, Any] = {
        "decision_id": "p1",
        "session_id": "s1",
        "install_id": "i1",
        "kind": "shown",
        "language": "python",
        "trigger": "automatic",
        "model_id": "/home/me/models/qwen.gguf",
        "edits": 1,
        "original": "x = 1\n",
        "predicted": "x = 2\n",
        **over,
    }
    return NextEditEvent(**fields)


@pytest.mark.parametrize(("level", "has_text"), [("metrics", False), ("full", True)])
def test_next_edit_events_carry_the_window_only_at_full(level: str, has_text: bool) -> None:
    event = apply_level(_next_edit(), level)  # type: ignore[arg-type]
    assert isinstance(event, NextEditEvent)
    assert (event.original is not None, event.predicted is not None) == (has_text, has_text)
    assert event.model_id.startswith("local:") != has_text
    assert apply_level(_next_edit(), "off") is None
    assert parse_event(event.model_dump(mode="json")) == event


def test_a_next_edit_rejection_needs_its_reason_and_only_it_has_one() -> None:
    assert _next_edit(kind="rejected", reason="typed").reason == "typed"
    with pytest.raises(ValidationError):
        _next_edit(kind="rejected")
    with pytest.raises(ValidationError):
        _next_edit(kind="accepted", reason="typed")
