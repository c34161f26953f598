"""What users did with suggestions, kept on this machine as training examples for the model.

Locally, the server records each suggestion whose outcome is known (accepted and retained,
partially accepted, ignored, dismissed) with the text around it, its reward and the propensity
with which the gate showed it. The store is a SQLite file in the cache directory, bounded in rows
(the oldest go first), and is never sent anywhere: telemetry decides separately what leaves the
machine. In the backend the same examples come from events that carry text (telemetry level
`full`).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from completion.types import CompletionRequest, Decision
from telemetry.events import MIN_PROPENSITY, OutcomeEvent
from training.examples import FimExample

FEEDBACK_FILE = "training/feedback.sqlite"
"""The store's place under the cache directory: the server keeps it, `tabloop train model` reads
it."""
DEFAULT_MAX_ROWS = 20_000
MAX_TEXT_CHARS = 8_000  # of the prefix or suffix kept around one suggestion
MAX_INVERSE_PROPENSITY = 20.0
"""The most an example's inverse propensity weight may be (a weight, 1 / probability)."""
DISTRACTION_SHARE = 0.25
"""What an ignored or dismissed suggestion costs the model, in shares of a suggestion: its reward
is -0.25 where an accepted one earns 1. The gate's λ (`distraction_cost`) is in characters."""
PENDING_KEPT = 512  # shown suggestions awaiting their outcome

_SCHEMA = """
CREATE TABLE IF NOT EXISTS feedback (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created REAL NOT NULL,
    path TEXT NOT NULL,
    prefix TEXT NOT NULL,
    suggestion TEXT NOT NULL,
    suffix TEXT NOT NULL,
    outcome TEXT NOT NULL,
    reward REAL NOT NULL,
    propensity REAL NOT NULL
)
"""


@dataclass(frozen=True)
class Feedback:
    """One shown suggestion and what became of it."""

    path: str
    prefix: str
    suggestion: str
    suffix: str
    outcome: str  # accepted, partial, ignored, dismissed
    reward: float
    propensity: float


class FeedbackStore:
    """A bounded on-disk store of `Feedback`, safe to use from several threads."""

    def __init__(self, path: Path, max_rows: int = DEFAULT_MAX_ROWS) -> None:
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False)
        with self._lock, self._db:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(_SCHEMA)

    def record(self, item: Feedback) -> None:
        """Keep one example; the oldest are dropped beyond `max_rows`."""
        if not item.suggestion:
            return
        if not 0.0 < item.propensity <= 1.0:
            raise ValueError(f"propensity must be in (0, 1], not {item.propensity}")
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO feedback (created, path, prefix, suggestion, suffix, outcome, reward,"
                " propensity) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    time.time(),
                    item.path,
                    item.prefix[-MAX_TEXT_CHARS:],
                    item.suggestion,
                    item.suffix[:MAX_TEXT_CHARS],
                    item.outcome,
                    float(item.reward),
                    float(item.propensity),
                ),
            )
            self._db.execute(
                "DELETE FROM feedback WHERE id <= (SELECT MAX(id) FROM feedback) - ?",
                (self.max_rows,),
            )

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM feedback").fetchone()[0])

    def outcome_counts(self) -> dict[str, int]:
        with self._lock:
            found = self._db.execute(
                "SELECT outcome, COUNT(*) FROM feedback GROUP BY outcome ORDER BY outcome"
            ).fetchall()
        return {str(outcome): int(count) for outcome, count in found}

    def last_id(self) -> int:
        """The newest row's id (0 when empty): a run trains on rows up to the id it started at."""
        with self._lock:
            return int(self._db.execute("SELECT COALESCE(MAX(id), 0) FROM feedback").fetchone()[0])

    def mean_reward(self, upto_id: int) -> float:
        with self._lock:
            row = self._db.execute(
                "SELECT COALESCE(AVG(reward), 0) FROM feedback WHERE id <= ?", (upto_id,)
            ).fetchone()
        return float(row[0])

    def rows(self, upto_id: int, batch: int = 256) -> Iterator[Feedback]:
        """Rows with id <= `upto_id`, oldest first, read `batch` at a time."""
        after = 0
        while True:
            with self._lock:
                page = self._db.execute(
                    "SELECT id, path, prefix, suggestion, suffix, outcome, reward, propensity "
                    "FROM feedback WHERE id > ? AND id <= ? ORDER BY id LIMIT ?",
                    (after, upto_id, batch),
                ).fetchall()
            if not page:
                return
            for row in page:
                after = row[0]
                yield Feedback(*row[1:])

    def close(self) -> None:
        with self._lock:
            self._db.close()


def feedback_reward(
    kind: str, accepted_chars: int | None, suggestion: str, retained_share: float = 1.0
) -> float | None:
    """The reward a suggestion's outcome earns as a training example, the same on this machine
    and in the backend: accepted 1, partially accepted the accepted share, each times the share
    of the accepted characters still in the document at the retention checkpoint (the backend
    knows it; locally it is not awaited: 1); ignored or dismissed -`DISTRACTION_SHARE`; None for
    outcomes that judge nothing (superseded, not viewed)."""
    kept = min(max(retained_share, 0.0), 1.0)
    if kind == "accepted":
        return kept
    if kind == "partial":
        return min(1.0, (accepted_chars or 0) / max(len(suggestion), 1)) * kept
    if kind in ("ignored", "dismissed"):
        return -DISTRACTION_SHARE
    return None


class FeedbackRecorder:
    """Pairs each shown suggestion with its outcome, as the server does while serving (and the
    replay while it plays a user): `shown` when a suggestion is shown, `settled` when its
    outcome event arrives, which gives the row to keep (None: nothing to keep)."""

    def __init__(self, kept: int = PENDING_KEPT) -> None:
        self.kept = kept
        self._pending: OrderedDict[str, Feedback] = OrderedDict()

    def shown(self, decision: Decision, request: CompletionRequest) -> None:
        if not decision.shown:
            return
        self._pending[decision.decision_id] = Feedback(
            request.path or "",
            request.prefix,
            decision.text,
            request.suffix,
            "",
            0.0,
            max(min(decision.propensity, 1.0), MIN_PROPENSITY),
        )
        while len(self._pending) > self.kept:
            self._pending.popitem(last=False)

    def settled(self, event: OutcomeEvent) -> Feedback | None:
        item = self._pending.pop(event.decision_id, None)
        if item is None:
            return None
        # Retention is not awaited here; the backend scales by it (`feedback_reward`).
        reward = feedback_reward(event.kind, event.accepted_chars, item.suggestion)
        if reward is None:
            return None
        return replace(item, outcome=event.kind, reward=reward)


def advantage_scale(rewards: Iterable[float], baseline: float) -> float:
    """The largest |reward - baseline| (at least 1), so that advantages lie in [-1, 1]."""
    scale = 1.0
    for reward in rewards:
        scale = max(scale, abs(reward - baseline))
    return scale


def as_example(item: Feedback, baseline: float, scale: float) -> FimExample:
    """A feedback row as a training example: advantage (reward - baseline) / scale, and the
    inverse of the logged propensity, clipped."""
    return FimExample(
        item.path,
        item.prefix,
        item.suggestion,
        item.suffix,
        "feedback",
        advantage=(item.reward - baseline) / scale,
        weight=1.0 / max(item.propensity, 1.0 / MAX_INVERSE_PROPENSITY),
        source="feedback",
    )


def stream_feedback_examples(store: FeedbackStore, upto_id: int) -> Iterator[FimExample]:
    """Every row up to `upto_id` once per epoch, epoch after epoch (ends if there are none)."""
    baseline = store.mean_reward(upto_id)
    scale = advantage_scale((item.reward for item in store.rows(upto_id)), baseline)
    while True:
        produced = 0
        for item in store.rows(upto_id):
            produced += 1
            yield as_example(item, baseline, scale)
        if produced == 0:
            return
