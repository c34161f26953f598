"""A request whose suggestion would come too late waits a little for the pause to turn out long."""

from __future__ import annotations

import pytest

from completion.latency import likely_pause_ms
from lsp_server.features.inline import wait_for_a_long_pause
from tests.completion.test_latency import times


class SteppedClock:
    """A monotonic clock that moves only when the wait sleeps: the test decides what time it is,
    and no real time passes."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


async def test_a_thinking_pause_is_served_once_it_outlasts_the_word_boundaries() -> None:
    """A typist's rhythm: 0.4 s within words, 1.2 s at word boundaries, 10 s at line ends. At the
    editor's request (idle 150 ms) the likely rest of the pause is short; once the user has been
    idle past the word-boundary pauses, only the line-end pauses remain, and a suggestion that
    takes 3 s is worth computing."""
    clock = SteppedClock()
    gaps = [400, 400, 1200, 400, 1200, 400, 10_000] * 4
    changes = times(*gaps, start=clock.now - 0.150 - sum(gaps) / 1000)
    first_token_ms = 3000.0

    def pause() -> float | None:
        return likely_pause_ms(changes, clock())

    def late() -> bool:
        rest = pause()
        return rest is not None and first_token_ms > rest

    assert late()  # answered empty at once before this wait
    started = clock()
    rest = await wait_for_a_long_pause(
        late, pause, lambda: True, wait_ms=5000, step_ms=20, clock=clock, sleep=clock.sleep
    )
    assert rest is not None and rest > first_token_ms
    # Idle 150 ms + the wait: it ends on the first look past the 1.2 s word boundaries.
    assert clock() - started == pytest.approx(1.06)


async def test_the_wait_ends_at_its_limit() -> None:
    clock = SteppedClock()
    # Steps of 1/64 s, which add up exactly: the wait ends on the first look at its limit.
    rest = await wait_for_a_long_pause(
        lambda: True, lambda: 42.0, lambda: True, 125, 15.625, clock=clock, sleep=clock.sleep
    )
    assert rest == 42.0
    assert clock.slept == [0.015625] * 8


async def test_the_wait_ends_when_the_document_changes() -> None:
    clock = SteppedClock()
    looks = []

    def current() -> bool:
        looks.append(clock())
        return len(looks) < 3  # the user typed: the request is stale

    await wait_for_a_long_pause(
        lambda: True, lambda: None, current, 5000, 10, clock=clock, sleep=clock.sleep
    )
    assert len(looks) == 3 and clock.slept == pytest.approx([0.010] * 2)


async def test_a_request_in_time_does_not_wait() -> None:
    clock = SteppedClock()
    await wait_for_a_long_pause(
        lambda: False, lambda: None, lambda: True, 5000, 10, clock=clock, sleep=clock.sleep
    )
    assert clock.slept == []
