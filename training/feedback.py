"""What users did with suggestions, kept on this machine as training examples for the model.

Locally, the server records each suggestion whose outcome is known (accepted and retained,
partially accepted, ignored, dismissed) with the text around it, its reward and the propensity
with which the gate showed it. The store is a SQLite file in the cache directory, shared by the
workspaces of this machine; every row carries the workspace it was made in (its root's real
path, `training.registry.workspace_key`), and a `FeedbackStore` is one workspace's view of the
file: it writes rows of that workspace and reads only them, so nothing from one workspace trains
or judges another's adapter. Rows kept before rows had a workspace have none and are read by no
workspace. Each workspace's rows are bounded (the oldest go first). Nothing here is sent
anywhere: telemetry decides separately what leaves the machine. In the backend the same examples
come from events that carry text (telemetry level `full`).
"""

from __future__ import annotations

import itertools
import sqlite3
import statistics
import threading
import time
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from completion.types import CompletionRequest, Decision
from telemetry.events import MIN_PROPENSITY, OutcomeEvent
from training.examples import FimExample
from training.registry import workspace_key
from training.window import OutcomeKey, TrainingWindow

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
    propensity REAL NOT NULL,
    workspace TEXT,
    model_version TEXT,
    kept TEXT,
    decision_id TEXT
)
"""
_FIELDS = (
    "path, prefix, suggestion, suffix, outcome, reward, propensity, model_version, kept,"
    " decision_id"
)  # a `Feedback`'s, in order
_INDEX = "CREATE INDEX IF NOT EXISTS feedback_workspace ON feedback (workspace, id)"


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
    model_version: str | None = None
    """The adapter version that wrote the suggestion (`lsp_server.features.adapters`), by which a
    workspace's canary is judged (`training.local_canary`); None: not known (older rows)."""
    kept: str | None = None
    """What the user kept in place of an accepted or partially accepted suggestion, from the
    logged cursor on: the accepted text when it settled, then (in the server) what the document
    holds there at the first retention checkpoint, edits included; None for other outcomes and
    for rows kept before rows carried it. A held-out row's kept text judges a candidate adapter
    (`training.evaluate`)."""
    decision_id: str | None = None
    """The decision that showed the suggestion, by which its kept text is updated."""


class WorkspaceTable(ABC):
    """One workspace's view of a table in a SQLite file of the cache (bounded, safe to use from
    several threads): the connection, its lock, the bound (`max_rows`, by default the class's
    `DEFAULT_ROWS`) and the workspace's key; `_create` makes the table."""

    DEFAULT_ROWS: int

    def __init__(
        self, path: Path, max_rows: int | None = None, *, workspace: Path | str | None = None
    ) -> None:
        max_rows = self.DEFAULT_ROWS if max_rows is None else max_rows
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.max_rows = max_rows
        self.workspace = workspace_key(workspace) if workspace is not None else None
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False)
        with self._lock, self._db:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._create(self._db)

    @abstractmethod
    def _create(self, db: sqlite3.Connection) -> None:
        """Make the table (and migrate an older one) in `db`."""

    def close(self) -> None:
        with self._lock:
            self._db.close()


class FeedbackStore(WorkspaceTable):
    """One workspace's view of the on-disk feedback store (bounded, safe to use from several
    threads): it records rows of `workspace` and reads only those. Without a workspace (a
    store of its own, such as the replay's) it records and reads rows that have none."""

    DEFAULT_ROWS = DEFAULT_MAX_ROWS

    def _create(self, db: sqlite3.Connection) -> None:
        db.execute(_SCHEMA)
        for column in ("workspace", "model_version", "kept", "decision_id"):
            _add_column(db, column)
        db.execute(_INDEX)

    def record(self, item: Feedback) -> None:
        """Keep one example of this workspace; its oldest rows go beyond `max_rows`."""
        if not item.suggestion:
            return
        if not 0.0 < item.propensity <= 1.0:
            raise ValueError(f"propensity must be in (0, 1], not {item.propensity}")
        with self._lock, self._db:
            self._db.execute(
                "INSERT INTO feedback (created, path, prefix, suggestion, suffix, outcome, reward,"
                " propensity, workspace, model_version, kept, decision_id)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    time.time(),
                    item.path,
                    item.prefix[-MAX_TEXT_CHARS:],
                    item.suggestion,
                    item.suffix[:MAX_TEXT_CHARS],
                    item.outcome,
                    float(item.reward),
                    float(item.propensity),
                    self.workspace,
                    item.model_version,
                    item.kept,
                    item.decision_id,
                ),
            )
            self._db.execute(
                "DELETE FROM feedback WHERE workspace IS ? AND id <= (SELECT id FROM feedback"
                " WHERE workspace IS ? ORDER BY id DESC LIMIT 1 OFFSET ?)",
                (self.workspace, self.workspace, self.max_rows),
            )

    def keep_text(self, decision_id: str, kept: str) -> bool:
        """Set the kept text of this workspace's row of `decision_id` (the text the user kept in
        place of the suggestion once it settled); False when no such row is kept."""
        with self._lock, self._db:
            found = self._db.execute(
                "UPDATE feedback SET kept = ? WHERE workspace IS ? AND decision_id = ?",
                (kept, self.workspace, decision_id),
            )
            return found.rowcount > 0

    def _scalar(self, query: str, *parameters: object) -> Any:
        """One value of a query over this workspace's rows (`?` first stands for it)."""
        with self._lock:
            return self._db.execute(query, (self.workspace, *parameters)).fetchone()[0]

    def count(self) -> int:
        return int(self._scalar("SELECT COUNT(*) FROM feedback WHERE workspace IS ?"))

    def count_after(self, row_id: int) -> int:
        """This workspace's rows newer than `row_id` (what came in since a mark or a run)."""
        return int(
            self._scalar("SELECT COUNT(*) FROM feedback WHERE workspace IS ? AND id > ?", row_id)
        )

    def unattributed(self) -> int:
        """Rows of no workspace (kept before rows carried one): never read by a workspace."""
        with self._lock:
            found = self._db.execute("SELECT COUNT(*) FROM feedback WHERE workspace IS NULL")
            return int(found.fetchone()[0])

    def outcome_counts(self) -> dict[str, int]:
        with self._lock:
            found = self._db.execute(
                "SELECT outcome, COUNT(*) FROM feedback WHERE workspace IS ? GROUP BY outcome"
                " ORDER BY outcome",
                (self.workspace,),
            ).fetchall()
        return {str(outcome): int(count) for outcome, count in found}

    def last_id(self) -> int:
        """The newest row's id (0 when none): a run trains on rows up to the id it started at."""
        return int(self._scalar("SELECT COALESCE(MAX(id), 0) FROM feedback WHERE workspace IS ?"))

    def keys(self, upto_id: int) -> list[tuple[OutcomeKey, float]]:
        """((time, row), reward) of every row up to `upto_id`: what places a training window
        (`training.window`), without the text."""
        with self._lock:
            found = self._db.execute(
                "SELECT created, id, reward FROM feedback WHERE workspace IS ? AND id <= ?",
                (self.workspace, upto_id),
            ).fetchall()
        return [((float(created), int(row)), float(reward)) for created, row, reward in found]

    def rows(self, upto_id: int, batch: int = 256) -> Iterator[Feedback]:
        """Rows with id <= `upto_id`, oldest first, read `batch` at a time."""
        after = 0
        while True:
            with self._lock:
                page = self._db.execute(
                    f"SELECT id, {_FIELDS} FROM feedback WHERE workspace IS ? AND id > ?"
                    " AND id <= ? ORDER BY id LIMIT ?",
                    (self.workspace, after, upto_id, batch),
                ).fetchall()
            if not page:
                return
            for row in page:
                after = row[0]
                yield Feedback(*row[1:])

    def rows_by_id(self, ids: Iterable[int], batch: int = 256) -> Iterator[Feedback]:
        """This workspace's rows of `ids`, in that order, read `batch` at a time (an id that is
        gone, or another workspace's, is skipped)."""
        wanted = list(ids)
        for start in range(0, len(wanted), batch):
            chunk = wanted[start : start + batch]
            marks = ",".join("?" * len(chunk))
            with self._lock:
                found = self._db.execute(
                    f"SELECT id, {_FIELDS} FROM feedback WHERE workspace IS ? AND id IN ({marks})",
                    (self.workspace, *chunk),
                ).fetchall()
            by_id = {row[0]: Feedback(*row[1:]) for row in found}
            yield from (by_id[i] for i in chunk if i in by_id)

    def rewards_by_model(self, versions: Iterable[str], since: float) -> dict[str, list[float]]:
        """The rewards of this workspace's rows kept since `since` (time.time()) whose
        suggestion one of `versions` wrote, per version."""
        wanted = list(dict.fromkeys(versions))
        found: dict[str, list[float]] = {version: [] for version in wanted}
        marks = ", ".join("?" * len(wanted))
        with self._lock:
            rows = self._db.execute(
                "SELECT model_version, reward FROM feedback WHERE workspace IS ? AND created >= ?"
                f" AND model_version IN ({marks}) ORDER BY id",
                (self.workspace, since, *wanted),
            ).fetchall()
        for version, reward in rows:
            found[str(version)].append(float(reward))
        return found


def _add_column(db: sqlite3.Connection, name: str) -> None:
    """Migrate a store from before rows carried `name` (their workspace, the model version that
    wrote them, the kept text and the decision): the old rows keep none."""
    columns = {row[1] for row in db.execute("PRAGMA table_info(feedback)")}
    if name in columns:
        return
    try:
        db.execute(f"ALTER TABLE feedback ADD COLUMN {name} TEXT")
    except sqlite3.OperationalError as exc:  # another process migrated it meanwhile
        if "duplicate column" not in str(exc):
            raise


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

    def shown(
        self, decision: Decision, request: CompletionRequest, model_version: str | None = None
    ) -> None:
        """A suggestion was shown (`model_version`: the adapter version that wrote it)."""
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
            model_version,
            decision_id=decision.decision_id,
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
        kept = None
        if event.kind == "accepted":
            kept = item.suggestion
        elif event.kind == "partial":  # the accepted characters, as if taken from the start
            kept = item.suggestion[: event.accepted_chars or 0]
        return replace(item, outcome=event.kind, reward=reward, kept=kept)


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


def stream_feedback_examples(
    store: FeedbackStore, window: TrainingWindow, rewards: Mapping[OutcomeKey, float], seed: int
) -> Iterator[FimExample]:
    """The window's training rows, epoch after epoch (`TrainingWindow.epoch`: the new rows
    newest first, the replayed older ones among them), their advantage against the mean reward
    of the rows the window may train on (`rewards`: by key); ends at once when there are none.
    Held-out rows are never produced."""
    baseline, scale = window_baseline(window, rewards)
    for number in itertools.count():
        order = window.epoch(seed, number)
        if not order:
            return
        for item in store.rows_by_id(key[1] for key in order):
            yield as_example(item, baseline, scale)


def window_baseline(
    window: TrainingWindow, rewards: Mapping[OutcomeKey, float]
) -> tuple[float, float]:
    """(baseline, scale) of the advantages: the mean reward of the outcomes the window may
    train on (never the held-out ones), and the largest distance from it (at least 1)."""
    trainable = [rewards[key] for key in window.trainable if key in rewards]
    baseline = statistics.fmean(trainable) if trainable else 0.0
    return baseline, advantage_scale(trainable, baseline)
