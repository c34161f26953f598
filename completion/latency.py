"""Latency-aware skipping: is a suggestion worth computing, given how fast the user types?

A suggestion that arrives after the next keystroke is never seen: the editor asks again and the
old answer is stale. `LatencyModel` predicts the time to the first token of a prompt from this
engine's own recent calls (milliseconds per prompt token read, which dominates on a CPU), and
`likely_pause_ms` estimates, from the intervals between the user's recent edits and how long they
have been idle already, how much longer they will probably stay idle. When the prediction is
longer than that, the engine answers empty at once and the decision is logged as a silence for
`latency`.

People pause where the text gives them reason to: briefly between the keys of a word, longer at a
space or a bracket, longest at the end of a line, where the next line is thought out. So a pause is
read first from the intervals that followed edits of the same kind as the latest one
(`edit_kind`), and from all recent intervals when those are too few.
"""

from __future__ import annotations

import itertools
import statistics
import threading
from collections.abc import Sequence
from typing import Literal

EditKind = Literal["word", "boundary", "line", "other"]

# The user's recent rhythm: this many intervals between edits, and at least this many of them
# longer than the pause so far before anything is predicted.
RECENT_INTERVALS = 32
MIN_SAMPLES = 4


def edit_kind(inserted: str) -> EditKind:
    """What an edit was, for the pause after it: `line` (it broke a line), `word` (it ended in a
    letter, digit or underscore), `boundary` (it ended in anything else), `other` (no text
    inserted: a deletion)."""
    if not inserted:
        return "other"
    if "\n" in inserted:
        return "line"
    last = inserted[-1]
    return "word" if last.isalnum() or last == "_" else "boundary"


def likely_pause_ms(
    change_times_s: Sequence[float], now_s: float, kinds: Sequence[str] | None = None
) -> float | None:
    """How much longer the user will probably stay idle, given how long they have been; or None.

    `change_times_s` are the monotonic times of the document's recent edits, oldest first, and
    `kinds` their `edit_kind`s (optional). The user has been idle for `e = now - last edit`.
    Among their recent intervals between edits, those longer than `e` are the pauses this one can
    still become; the median of what remains of them (`interval - e`) is the likely rest of this
    pause. An editor asks after a short debounce, so `e` already says something: a fluent typist
    mid-word has few intervals longer than it, and those few are short; a user who stops to read
    has long ones. With `kinds`, the intervals after edits of the latest edit's kind decide when
    at least `MIN_SAMPLES` of them are longer than `e`: the pause after a line break is read
    from the pauses after line breaks. None with fewer than `MIN_SAMPLES` such intervals in
    all: nothing to predict from.
    """
    if len(change_times_s) < 2:
        return None
    idle_ms = (now_s - change_times_s[-1]) * 1000
    if kinds is not None and len(kinds) == len(change_times_s):
        same = [
            (later - earlier) * 1000 - idle_ms
            for earlier, later, kind in zip(change_times_s, change_times_s[1:], kinds, strict=False)
            if kind == kinds[-1] and (later - earlier) * 1000 > idle_ms
        ][-RECENT_INTERVALS:]
        if len(same) >= MIN_SAMPLES:
            return statistics.median(same)
    recent = list(change_times_s[-(RECENT_INTERVALS + 1) :])
    longer = [
        (later - earlier) * 1000 - idle_ms
        for earlier, later in itertools.pairwise(recent)
        if (later - earlier) * 1000 > idle_ms
    ]
    if len(longer) < MIN_SAMPLES:
        return None
    return statistics.median(longer)


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
