"""`tabloop bench complete`'s accounting: every request counted by how it ended, every pause by
whether a suggestion was on screen before the next key (synthetic records, no server)."""

from __future__ import annotations

from typing import Any

from evaluation.bench.complete import Asked, Keystroke, Pause, summarize


def record(request_id: str, outcome: str, *, model: bool = True, source: str = "") -> Any:
    return {
        "request_id": request_id,
        "outcome": outcome,
        "reached_model": model,
        "cache_source": source,
        "handler_ms": 10.0,
    }


def status(calls: int) -> dict[str, Any]:
    return {"model": {"calls": calls, "prefillTokens": 10 * calls}}


def asked(
    request_id: str, answered: float | None, cancelled: float | None = None, text: str = ""
) -> Asked:
    return Asked(request_id, 0.0, answered_at=answered, cancelled_at=cancelled, suggestion=text)


def test_cancelled_and_skipped_requests_are_counted_as_what_they_were() -> None:
    shown = asked("r1", 0.5, text="x = 1")
    cancelled = asked("r2", None, cancelled=0.3)
    skipped = asked("r3", 0.2)
    silenced = asked("r4", 0.9)
    typed = asked("r5", 0.16, text="y")
    pauses = [
        Pause(2.0, first=shown, on_screen=shown, on_screen_ms=500.0, asked=[shown]),
        Pause(0.3, first=cancelled, asked=[cancelled]),
        Pause(1.5, first=skipped, asked=[skipped]),
        Pause(1.2, first=silenced, asked=[silenced]),
        Pause(0.2, first=typed, on_screen=typed, on_screen_ms=160.0, asked=[typed]),
    ]
    records = {
        "r1": record("r1", "shown"),
        "r2": record("r2", "cancelled"),
        "r3": {
            **record("r3", "latency_skip"),
            "wait_ms": 250.0,
            "predicted_ms": 1800.0,
            "likely_pause_ms": 900.0,
        },
        "r4": record("r4", "silenced"),
        "r5": record("r5", "shown", source="typing"),
    }
    report = summarize([Keystroke("a", 0.1)] * 10, pauses, records, status(0), status(3))
    assert report["requests"] == 5
    assert report["requests_by_outcome"] == {
        "shown": 2,
        "cancelled": 1,
        "latency_skip": 1,
        "silenced": 1,
    }
    # The model's calls: the shown one, the cancelled one (at its cancel time) and the silenced
    # one; not the skipped one, not the typing-cache hit.
    assert report["model_calls"] == 3 and report["model_calls_cancelled"] == 1
    assert report["model_calls_ms_p50"] == 500.0
    assert report["model_served"] == 1 and report["typing_cache_served"] == 1
    thinking = report["thinking_pauses"]
    assert thinking["n"] == 3 and thinking["on_screen"] == 1
    assert thinking["why_not"] == {"latency_skip": 1, "silenced": 1}
    # The gate would not show the silenced one: 1 of the 2 others was on screen in time.
    assert thinking["gate_would_show"] == 2
    assert thinking["on_screen_share_of_gate_would_show"] == 0.5
    # What the server predicted at the thinking pause it answered as too late.
    assert report["thinking_pause_latency_skips"] == [
        {"pause_s": 1.5, "waited_ms": 250.0, "predicted_ms": 1800.0, "likely_pause_ms": 900.0}
    ]


def test_an_answer_after_the_next_key_is_not_on_screen_and_missing_records_are_named() -> None:
    late = asked("r1", None, cancelled=0.4)  # the server finished, but after the next key
    lost = asked("r2", 0.3)
    early = asked("r3", None, cancelled=0.2)  # cancelled before the server began it
    pauses = [
        Pause(1.0, first=late, asked=[late]),
        Pause(1.0, first=lost, asked=[lost]),
        Pause(1.0, first=early, asked=[early]),
    ]
    keys = [Keystroke("a", 0.1)] * 10
    report = summarize(keys, pauses, {"r1": record("r1", "shown")}, status(0), status(1))
    assert report["thinking_pauses"]["why_not"] == {
        "arrived_after_next_key": 1,
        "unrecorded": 1,
        "cancelled_before_handled": 1,
    }
    assert report["unrecorded_requests"] == ["r2"]
    assert report["suggestions_shown"] == 0
