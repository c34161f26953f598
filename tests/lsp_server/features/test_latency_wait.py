"""A request whose suggestion would come too late waits a little for the pause to turn out long."""

from __future__ import annotations

import time

from completion.latency import likely_pause_ms
from lsp_server.features.inline import wait_for_a_long_pause
from tests.completion.test_latency import times


async def test_a_thinking_pause_is_served_once_it_outlasts_the_word_boundaries() -> None:
    """A typist's rhythm: 0.4 s within words, 1.2 s at word boundaries, 10 s at line ends (slow,
    so that a stalled test machine cannot skip a phase). At the editor's request (idle 150 ms)
    the likely rest of the pause is short; once the user has been idle past the word-boundary
    pauses, only the line-end pauses remain, and a suggestion that takes 3 s is worth
    computing."""
    gaps = [400, 400, 1200, 400, 1200, 400, 10_000] * 4
    now = time.monotonic()
    changes = times(*gaps, start=now - 0.150 - sum(gaps) / 1000)
    first_token_ms = 3000.0

    def pause() -> float | None:
        return likely_pause_ms(changes, time.monotonic())

    def late() -> bool:
        rest = pause()
        return rest is not None and first_token_ms > rest

    assert late()  # answered empty at once before this wait
    started = time.monotonic()
    rest = await wait_for_a_long_pause(late, pause, lambda: True, wait_ms=5000, step_ms=20)
    waited_ms = (time.monotonic() - started) * 1000
    assert rest is not None and rest > first_token_ms
    assert waited_ms < 4000  # past the 1.2 s boundaries, well before the 5 s limit


async def test_the_wait_ends_at_its_limit_or_when_the_document_changes() -> None:
    started = time.monotonic()
    assert await wait_for_a_long_pause(lambda: True, lambda: 42.0, lambda: True, 120, 10) == 42.0
    assert (time.monotonic() - started) * 1000 >= 120

    calls = []

    def current() -> bool:
        calls.append(1)
        return len(calls) < 3  # the user typed: the request is stale

    started = time.monotonic()
    await wait_for_a_long_pause(lambda: True, lambda: None, current, 5000, 10)
    assert (time.monotonic() - started) * 1000 < 1000 and len(calls) == 3

    started = time.monotonic()
    await wait_for_a_long_pause(lambda: False, lambda: None, lambda: True, 5000, 10)
    assert (time.monotonic() - started) * 1000 < 50  # not late: no wait at all
