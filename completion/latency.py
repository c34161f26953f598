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
    """Time to first token as a function of prompt tokens read, learned from observed calls.

    A line through the recent calls: a fixed cost per call plus a cost per token read, fitted by
    least squares with recent calls weighing more (each new call takes `smoothing` of the weight).
    A fixed cost matters for an engine that keeps almost all of the prompt from the call before:
    reading 2 tokens costs ~20 ms there, and a cost per token alone would then predict 10 ms per
    token for the next call's 60. While the calls read too similar amounts to tell the two apart,
    the line goes through zero (milliseconds per token only).
    """

    def __init__(self, *, smoothing: float = 0.3, min_observations: int = 2) -> None:
        self.smoothing = smoothing
        self.min_observations = min_observations
        self.observations = 0
        # Weighted sums over the calls: weight, tokens, ms, tokens², tokens x ms.
        self._sums = [0.0] * 5
        self._lock = threading.Lock()

    def observe(self, tokens_read: int, first_token_ms: float) -> None:
        """One call read `tokens_read` prompt tokens and produced its first token after that."""
        if tokens_read <= 0 or first_token_ms <= 0:
            return
        n, t = float(tokens_read), float(first_token_ms)
        with self._lock:
            # The first call weighs 1; each later one takes `smoothing` of the total.
            keep, weight = (1 - self.smoothing, self.smoothing) if self.observations else (0, 1)
            self.observations += 1
            new = (1.0, n, t, n * n, n * t)
            self._sums = [keep * old + weight * x for old, x in zip(self._sums, new, strict=True)]

    def line(self) -> tuple[float, float] | None:
        """(ms per call, ms per token) fitted so far, or None before enough observations."""
        with self._lock:
            if self.observations < self.min_observations:
                return None
            w, sn, st, snn, snt = self._sums
        mean_n, mean_t = sn / w, st / w
        spread = snn / w - mean_n * mean_n
        if spread > (0.1 * mean_n) ** 2:
            slope = (snt / w - mean_n * mean_t) / spread
            fixed = mean_t - slope * mean_n
            if slope > 0 and fixed >= 0:
                return fixed, slope
        return 0.0, snt / snn  # through zero: the calls cannot separate the two costs

    def predict(self, tokens_to_read: int, extra_ms: float = 0.0) -> float | None:
        """Predicted milliseconds to the first token, or None before enough observations."""
        fitted = self.line()
        if fitted is None:
            return None
        fixed, per_token = fitted
        return extra_ms + fixed + per_token * max(tokens_to_read, 1)
