"""Latency-aware skipping: is a suggestion worth computing, given how fast the user types?

A suggestion that arrives after the next keystroke is never seen: the editor asks again and the
old answer is stale. `LatencyModel` predicts the time to the first token of a prompt from this
engine's own recent calls (milliseconds per prompt token read, which dominates on a CPU), and
`likely_pause_ms` estimates, from the intervals between the user's recent edits, how long they
will probably pause after this one. When the prediction is longer than the pause, the engine
answers empty at once and the decision is logged as a silence for `latency`.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Sequence

# Intervals longer than this end a burst of typing: they are pauses, not the typing rhythm.
BURST_GAP_MS = 1500.0
# Fewer intervals than this in the current burst say nothing about the rhythm yet.
MIN_INTERVALS = 3
RECENT_INTERVALS = 8


def likely_pause_ms(change_times_s: Sequence[float], now_s: float) -> float | None:
    """The pause the user will probably leave after their latest edit, or None when unknown.

    `change_times_s` are the monotonic times of the document's recent edits, oldest first. Within
    the current burst of typing (no gap over `BURST_GAP_MS`), the upper quartile of the intervals
    between edits: a suggestion slower than that would be overtaken by three keystrokes in four.
    Outside a burst (the last edit is old, or too few edits), None: nothing to predict from.
    """
    if len(change_times_s) < MIN_INTERVALS + 1:
        return None
    if (now_s - change_times_s[-1]) * 1000 > BURST_GAP_MS:
        return None
    intervals: list[float] = []
    for earlier, later in zip(change_times_s[-2::-1], change_times_s[::-1], strict=False):
        gap = (later - earlier) * 1000
        if gap > BURST_GAP_MS:
            break
        intervals.append(gap)
        if len(intervals) == RECENT_INTERVALS:
            break
    if len(intervals) < MIN_INTERVALS:
        return None
    return statistics.quantiles(intervals, n=4, method="inclusive")[2]


class LatencyModel:
    """Time to first token as a function of prompt tokens read, learned from observed calls."""

    def __init__(self, *, smoothing: float = 0.3, min_observations: int = 2) -> None:
        self.smoothing = smoothing
        self.min_observations = min_observations
        self.ms_per_token: float | None = None
        self.overhead_ms = 0.0
        self.observations = 0
        self._lock = threading.Lock()

    def observe(self, tokens_read: int, first_token_ms: float) -> None:
        """One call read `tokens_read` prompt tokens and produced its first token after that."""
        if tokens_read <= 0 or first_token_ms <= 0:
            return
        rate = first_token_ms / tokens_read
        with self._lock:
            self.observations += 1
            if self.ms_per_token is None:
                self.ms_per_token = rate
            else:
                self.ms_per_token += self.smoothing * (rate - self.ms_per_token)

    def predict(self, tokens_to_read: int, extra_ms: float = 0.0) -> float | None:
        """Predicted milliseconds to the first token, or None before enough observations."""
        with self._lock:
            if self.ms_per_token is None or self.observations < self.min_observations:
                return None
            return extra_ms + self.ms_per_token * max(tokens_to_read, 1)
