"""Latency-aware skipping: the typing rhythm, the engine's speed model, and the skip itself."""

from __future__ import annotations

import time

import pytest

from completion.engine import Engine
from completion.gate import builtin_policy
from completion.latency import LatencyModel, edit_kind, likely_pause_ms
from completion.settings import CompletionSettings
from completion.types import LATENCY_SKIP, CompletionRequest, TooLate
from tests.support.scripted_model import ScriptedModel


def times(*gaps_ms: float, start: float = 100.0) -> list[float]:
    found = [start]
    for gap in gaps_ms:
        found.append(found[-1] + gap / 1000)
    return found


def test_a_fluent_typist_mid_word_will_type_again_soon() -> None:
    # Mostly 100 ms between keys, a few 300 ms gaps at word boundaries; idle for 150 ms now.
    changes = times(*([100, 100, 100, 300] * 6))
    assert likely_pause_ms(changes, changes[-1] + 0.150) == pytest.approx(150.0)


def test_a_user_who_stops_to_read_has_long_pauses_ahead() -> None:
    changes = times(*([100, 100, 2500, 100, 3000] * 2))
    assert likely_pause_ms(changes, changes[-1] + 0.150) == pytest.approx(2600.0)


def test_too_few_longer_intervals_say_nothing() -> None:
    changes = times(100, 120, 400, 90)
    assert likely_pause_ms(changes, changes[-1] + 0.150) is None
    long_idle = times(*([100] * 10))
    assert likely_pause_ms(long_idle, long_idle[-1] + 5.0) is None  # idle past every interval
    assert likely_pause_ms([], 10.0) is None


def test_edit_kinds() -> None:
    assert [edit_kind(t) for t in ("a", "x_", "9", " ", "(", ".", "\n", "\n    ", "")] == [
        "word",
        "word",
        "word",
        "boundary",
        "boundary",
        "boundary",
        "line",
        "line",
        "other",
    ]
    assert edit_kind("é") == "word"
    assert edit_kind("foo(") == "boundary"  # a pasted or accepted text: its last character


def typist(lines: int) -> tuple[list[float], list[str]]:
    """Edits of someone who types words at 100 ms a key, pauses 300 ms at a space and thinks
    2.5 s after each line break."""
    text = "value = compute(x)\n" * lines
    at, found, kinds = 100.0, [], []
    for char in text:
        previous = kinds[-1] if kinds else "word"
        at += {"word": 0.1, "boundary": 0.3, "line": 2.5}[previous]
        found.append(at)
        kinds.append(edit_kind(char))
    return found, kinds


def test_the_pause_after_a_line_break_is_read_from_pauses_after_line_breaks() -> None:
    changes, kinds = typist(lines=6)
    assert kinds[-1] == "line"
    # Among all recent intervals the few long ones are outvoted by 300 ms boundary pauses.
    assert likely_pause_ms(changes, changes[-1] + 0.150) == pytest.approx(150.0)
    assert likely_pause_ms(changes, changes[-1] + 0.150, kinds) == pytest.approx(2350.0)
    # Mid-word, the same history says the next key is near.
    mid_word = [k for k, kind in enumerate(kinds) if kind == "word"][-1] + 1
    rest = likely_pause_ms(changes[:mid_word], changes[mid_word - 1] + 0.050, kinds[:mid_word])
    assert rest == pytest.approx(50.0)


def test_too_few_pauses_of_the_same_kind_fall_back_to_all_of_them() -> None:
    changes, kinds = typist(lines=3)  # two line breaks before the last: fewer than MIN_SAMPLES
    assert likely_pause_ms(changes, changes[-1] + 0.150, kinds) == likely_pause_ms(
        changes, changes[-1] + 0.150
    )
    assert likely_pause_ms(changes, changes[-1] + 0.150, kinds[1:]) == likely_pause_ms(
        changes, changes[-1] + 0.150
    )  # kinds that do not match the edits are not used


def test_the_model_learns_milliseconds_per_token() -> None:
    model = LatencyModel(smoothing=0.5, min_observations=2)
    model.observe(100, 200.0)
    assert model.predict(100) is None  # one call is not enough
    model.observe(100, 400.0)
    assert model.predict(100) == pytest.approx(300.0)  # 2 ms/token, then halfway to 4
    assert model.predict(50, extra_ms=10) == pytest.approx(160.0)
    model.observe(0, 100.0)  # nothing read: says nothing about the rate
    assert model.predict(100) == pytest.approx(300.0)


def request(trigger: str = "automatic") -> CompletionRequest:
    return CompletionRequest(
        prefix="def area(r):\n    return ",
        suffix="\n",
        language="python",
        trigger=trigger,  # type: ignore[arg-type]
    )


def slow_engine(**settings: object) -> Engine:
    model = ScriptedModel(default="3.14 * r * r")
    always = builtin_policy(show_floor=1.0)  # these tests are about the skip, not the gate
    engine = Engine(
        CompletionSettings(cache=False, **settings),  # type: ignore[arg-type]
        model,
        policy_source=lambda: always,
        seed=1,
    )
    engine.latency.observe(10, 500.0)
    engine.latency.observe(10, 500.0)  # 50 ms per prompt token: any prompt takes seconds
    return engine


def test_a_suggestion_that_would_come_late_is_skipped_at_once() -> None:
    engine = slow_engine()
    decision = engine.complete(request(), pause_ms=150.0)
    assert decision.action == "silence" and decision.silence_reason == "latency"
    assert decision.reason == LATENCY_SKIP
    assert engine.model_calls == 0 and engine.latency_skips == 1
    # Its reasons, for the request's timing record: seconds of prompt against a 150 ms pause.
    assert decision.timings.likely_pause_ms == 150.0
    assert decision.timings.predicted_ms > 1000.0


def test_a_late_request_can_be_deferred_to_its_caller_uncounted() -> None:
    engine = slow_engine()
    with pytest.raises(TooLate) as raised:
        engine.complete(request(), pause_ms=150.0, defer_late=True)
    assert raised.value.predicted_ms > 1000.0  # seconds of prompt at 50 ms a token
    assert engine.latency_skips == 0 and engine.model_calls == 0  # nothing decided yet
    # Asked again once the pause has turned out long enough, it is answered.
    assert engine.complete(request(), pause_ms=1e9, defer_late=True).shown


def test_no_skip_without_a_rhythm_when_asked_or_when_switched_off() -> None:
    engine = slow_engine()
    assert engine.complete(request(), pause_ms=None).shown  # not typing: nothing to predict
    assert engine.complete(request("invoked"), pause_ms=150.0).shown  # the user asked
    off = slow_engine(latency_skip=False)
    assert off.complete(request(), pause_ms=150.0).shown
    assert engine.latency_skips == 0 and off.latency_skips == 0


def test_a_fast_enough_engine_answers() -> None:
    engine = slow_engine()
    assert engine.complete(request(), pause_ms=1e9).shown


def test_an_early_skip_counts_the_call_already_running() -> None:
    engine = slow_engine()  # 50 ms per prompt token
    short = CompletionRequest(prefix="x = ", suffix="", language="python")
    assert engine.skip_early(short, pause_ms=500.0) is None  # about 2 tokens: 100 ms
    engine._busy = (time.perf_counter(), 10_000.0)  # a call that will read its prompt for 10 s
    skipped = engine.skip_early(short, pause_ms=500.0)
    assert skipped is not None and skipped.silence_reason == "latency"
    assert skipped.timings.predicted_ms > 9_000.0  # the running call's 10 s counted
    assert engine.skip_early(short, pause_ms=None) is None
    invoked = CompletionRequest(prefix="x = ", suffix="", language="python", trigger="invoked")
    assert engine.skip_early(invoked, pause_ms=500.0) is None


class KeepingModel(ScriptedModel):
    """A scripted model that, like the fast engine, keeps the start of its last prompt."""

    kept_tokens = 0

    def tokens_to_read(self, prompt: str) -> int:
        return max(self.count_tokens(prompt) - self.kept_tokens, 1)


def test_the_prediction_counts_only_what_the_runner_will_read() -> None:
    model = KeepingModel(default="3.14 * r * r")
    always = builtin_policy(show_floor=1.0)
    engine = Engine(CompletionSettings(cache=False), model, policy_source=lambda: always, seed=1)
    engine.latency.observe(10, 500.0)
    engine.latency.observe(10, 500.0)  # 50 ms per prompt token
    body = "".join(f"    total += values[{i}]\n" for i in range(40))
    typing = CompletionRequest(
        prefix=f"def total(values):\n    total = 0\n{body}    return ",
        suffix="\n",
        language="python",
        uri="file:///total.py",
    )
    pause_ms = 2_000.0
    assert engine.skip_early(typing, pause_ms) is not None  # ~100 tokens: about 5 s
    assert engine.complete(typing, pause_ms=pause_ms).silence_reason == "latency"
    model.kept_tokens = model.count_tokens(typing.prefix) - 10
    assert engine.complete(typing, pause_ms=pause_ms).shown  # only the end is read: answered
    # Before its prompt is built, a request in the document of the last call counts the kept
    # tokens out too; one in another document does not.
    assert engine.skip_early(typing, pause_ms) is None
    elsewhere = CompletionRequest(
        prefix=typing.prefix, suffix="\n", language="python", uri="file:///other.py"
    )
    assert engine.skip_early(elsewhere, pause_ms) is not None


def test_the_server_tells_the_session_what_each_edit_was() -> None:
    from completion.session import SessionSignals
    from lsp_server.documents import DocumentChange, TextChange
    from lsp_server.features.session import TypingTracker

    clock = iter(range(100, 200))
    session = SessionSignals(clock=lambda: float(next(clock)))
    tracker = TypingTracker(session)
    uri = "file:///w/a.py"
    tracker.did_open(uri)
    for text in ("x", " ", "\n", ""):
        tracker.did_change(DocumentChange(uri, 1, (TextChange(0, 0, text),)))
    tracker.did_change(DocumentChange(uri, 2, (TextChange(0, 0, "y\n", whole=True),)))
    assert [kind for _, kind in session.edits(uri)] == [
        "word",
        "boundary",
        "line",
        "other",
        "other",
    ]
    assert [at for at, _ in session.edits(uri)] == [100.0, 101.0, 102.0, 103.0, 104.0]


def test_the_model_separates_a_fixed_cost_per_call() -> None:
    """An engine that keeps most of the prompt reads 2 tokens in ~20 ms and 60 in ~280 ms: a
    cost per token alone would predict 600 ms for 60 after the short read."""
    model = LatencyModel(smoothing=0.3, min_observations=2)
    for tokens, ms in [(60, 280.0), (2, 20.0), (40, 190.0), (2, 21.0), (80, 370.0), (3, 24.0)]:
        model.observe(tokens, ms)
    fitted = model.line()
    assert fitted is not None
    fixed, per_token = fitted
    assert 5 < fixed < 25 and 4.0 < per_token < 5.0
    assert model.predict(60) == pytest.approx(fixed + 60 * per_token)
    assert 250 < (model.predict(60) or 0) < 320
