"""A tenant's training examples for its adapter, read from the event store a page at a time.

Only decision events that carry text (editors send `prompt` and `suggestion` at telemetry level
`full`) and were shown can teach the model what to write. Each is joined with the outcome its
user gave it, and an accepted one with the share of its characters still there at the retention
checkpoint (the policy's, 120 s: code accepted and then deleted taught nothing), and becomes the
same example a workspace's local feedback gives (`training.feedback`: the reward of
`feedback_reward`, the logged propensity, `as_example`), so one objective trains both. The
logged prompt is the text before the cursor only: the examples have no suffix.

Which examples a version trains on is the training window (`training.window`, the same rule
as a workspace's): those after the serving version's mark by (decision time, row), newest
first, less the newest share (20%) held out for evaluation and never trained on, with a replayed
share of older ones among them. Events are read in pages by row id (keyset pagination), or by
the rows a window names, never all at once; a run reads only rows up to the newest it saw when
it first started, so a resumed run sees the same examples in the same order. Events skipped
(silence, no text, no outcome yet, an outcome that judges nothing, a body the schema refuses) are
counted by reason.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from backend.db.models import StoredEvent
from backend.storage import Storage
from common.languages import BY_ID
from telemetry.events import DecisionEvent, OutcomeEvent, RetentionEvent, parse_event
from training.examples import FimExample
from training.feedback import Feedback, as_example, feedback_reward, window_baseline
from training.window import OutcomeKey, WindowSettings, select_window

PAGE_ROWS = 500
# The checkpoint whose retained share scales an accepted suggestion's reward: the policy's
# (`RewardSettings.retention_after_s`; `backend.policy` imports this package, so not from there).
RETENTION_AFTER_S = 120

NO_TEXT = "shown without text (telemetry level below full)"
SILENCE = "silence"
NO_OUTCOME = "no outcome yet"
NO_JUDGEMENT = "outcome judges nothing (superseded, not viewed)"


@dataclass(frozen=True)
class LoggedFeedback:
    """A text-carrying decision with its outcome, as a feedback row."""

    row_id: int  # the decision's row in the event store
    time: float  # the decision's time, seconds since the epoch
    feedback: Feedback

    @property
    def key(self) -> tuple[float, int]:
        return (self.time, self.row_id)


def newest_event_row(storage: Storage, tenant_id: int) -> int:
    """Row id of the tenant's newest event (0 when none)."""
    with storage.session() as session:
        newest = session.scalar(
            select(func.max(StoredEvent.id)).where(StoredEvent.tenant_id == tenant_id)
        )
    return int(newest or 0)


def path_for_language(language: str) -> str:
    """A file name that tells the model (and `language_of`) the language of a logged prompt."""
    known = BY_ID.get(language)
    return f"untitled.{known.extensions[0]}" if known is not None and known.extensions else ""


def _as_time(value: datetime) -> float:
    return (value if value.tzinfo is not None else value.replace(tzinfo=UTC)).timestamp()


def _skip_reason(body: Any, exc: ValidationError) -> str:
    kind = body.get("type") if isinstance(body, dict) else None
    where = ".".join(str(part) for part in exc.errors()[0]["loc"][1:])
    return f"invalid {kind if isinstance(kind, str) else 'event'} {where or 'body'}"


def logged_feedback(
    storage: Storage,
    tenant_id: int,
    upto_row: int,
    skipped: Counter[str] | None = None,
    page_rows: int = PAGE_ROWS,
    retention_after_s: int = RETENTION_AFTER_S,
) -> Iterator[LoggedFeedback]:
    """The tenant's shown, text-carrying decisions with rows up to `upto_row`, oldest row first,
    each with the reward of its newest outcome scaled by the share of the accepted characters
    retained at the `retention_after_s` checkpoint (fully retained when none was reported; rows
    up to `upto_row` too); the others are counted in `skipped`."""
    skipped = skipped if skipped is not None else Counter()
    after = 0
    while True:
        with storage.session() as session:
            page = session.execute(
                select(StoredEvent.id, StoredEvent.body)
                .where(
                    StoredEvent.tenant_id == tenant_id,
                    StoredEvent.type == "decision",
                    StoredEvent.id > after,
                    StoredEvent.id <= upto_row,
                )
                .order_by(StoredEvent.id)
                .limit(page_rows)
            ).all()
            if not page:
                return
            after = int(page[-1][0])
            judged = _judged(session, tenant_id, page, upto_row, skipped, retention_after_s)
        yield from judged


def logged_feedback_rows(
    storage: Storage,
    tenant_id: int,
    upto_row: int,
    rows: Iterable[int],
    page_rows: int = PAGE_ROWS,
) -> Iterator[LoggedFeedback]:
    """As `logged_feedback`, for the decisions of `rows` in that order (a row that is not one
    is skipped), read `page_rows` at a time."""
    wanted = list(rows)
    for start in range(0, len(wanted), page_rows):
        chunk = wanted[start : start + page_rows]
        with storage.session() as session:
            page = session.execute(
                select(StoredEvent.id, StoredEvent.body).where(
                    StoredEvent.tenant_id == tenant_id,
                    StoredEvent.type == "decision",
                    StoredEvent.id.in_(chunk),
                    StoredEvent.id <= upto_row,
                )
            ).all()
            judged = _judged(session, tenant_id, page, upto_row, Counter(), RETENTION_AFTER_S)
        by_row = {item.row_id: item for item in judged}
        yield from (by_row[row] for row in chunk if row in by_row)


def _judged(
    session: Session,
    tenant_id: int,
    page: Sequence[Any],
    upto_row: int,
    skipped: Counter[str],
    retention_after_s: int,
) -> list[LoggedFeedback]:
    """The decisions of one page of rows that make examples, with their rewards."""
    decisions: list[tuple[int, DecisionEvent]] = []
    for row_id, body in page:
        try:
            event = parse_event(body)
        except ValidationError as exc:
            skipped[_skip_reason(body, exc)] += 1
            continue
        if not isinstance(event, DecisionEvent):
            continue
        if event.action != "show":
            skipped[SILENCE] += 1
        elif not event.prompt or not event.suggestion:
            skipped[NO_TEXT] += 1
        else:
            decisions.append((int(row_id), event))
    outcomes: dict[str, OutcomeEvent] = {}
    retained: dict[str, float] = {}
    if decisions:
        rows = session.execute(
            select(StoredEvent.body)
            .where(
                StoredEvent.tenant_id == tenant_id,
                StoredEvent.type.in_(("outcome", "retention")),
                StoredEvent.decision_id.in_([d.decision_id for _, d in decisions]),
                StoredEvent.id <= upto_row,
            )
            .order_by(StoredEvent.id)
        ).scalars()
        for body in rows:
            try:
                parsed = parse_event(body)
            except ValidationError as exc:
                skipped[_skip_reason(body, exc)] += 1
                continue
            if isinstance(parsed, OutcomeEvent):
                outcomes[parsed.decision_id] = parsed  # the newest wins
            elif (
                isinstance(parsed, RetentionEvent)
                and parsed.after_s == retention_after_s
                and parsed.accepted_chars > 0
            ):
                retained[parsed.decision_id] = parsed.retained_chars / parsed.accepted_chars
    judged = []
    for row_id, decision in decisions:
        outcome = outcomes.get(decision.decision_id)
        if outcome is None:
            skipped[NO_OUTCOME] += 1
            continue
        assert decision.suggestion is not None and decision.prompt is not None
        reward = feedback_reward(
            outcome.kind,
            outcome.accepted_chars,
            decision.suggestion,
            retained.get(decision.decision_id, 1.0),
        )
        if reward is None:
            skipped[NO_JUDGEMENT] += 1
            continue
        judged.append(
            LoggedFeedback(
                row_id,
                _as_time(decision.time),
                Feedback(
                    path_for_language(decision.language),
                    decision.prompt,
                    decision.suggestion,
                    "",
                    outcome.kind,
                    reward,
                    decision.propensity,
                ),
            )
        )
    return judged


class TenantExamples:
    """A tenant's examples up to one event row, and the training window over them.

    Construction reads the events once, keeping only each example's time, row and reward (not
    its text), to place the window and the reward baseline; the streams read them again.
    """

    def __init__(
        self,
        storage: Storage,
        tenant_id: int,
        upto_row: int,
        *,
        mark: OutcomeKey | None = None,
        window: WindowSettings | None = None,
        page_rows: int = PAGE_ROWS,
    ) -> None:
        self.storage = storage
        self.tenant_id = tenant_id
        self.upto_row = upto_row
        self.page_rows = page_rows
        self.skipped: Counter[str] = Counter()
        rewards: dict[OutcomeKey, float] = {}
        for item in logged_feedback(storage, tenant_id, upto_row, self.skipped, page_rows):
            rewards[item.key] = item.feedback.reward
        self.window = select_window(rewards, mark, window or WindowSettings())
        self.judged = len(rewards)
        self.held_out_count = len(self.window.held_out)
        self.train_count = len(self.window.new) + self.window.replayed  # one epoch
        self.baseline, self.scale = window_baseline(self.window, rewards)
        # Positive (accepted, partially accepted) and negative (ignored, dismissed) examples.
        self.outcomes = Counter(
            "positive" if r > 0 else "negative" if r < 0 else "neutral" for r in rewards.values()
        )

    @property
    def text_events(self) -> int:
        """Shown decisions that carried text, with or without a usable outcome."""
        return self.judged + self.skipped[NO_OUTCOME] + self.skipped[NO_JUDGEMENT]

    def _rows(self, keys: Iterable[OutcomeKey]) -> Iterator[LoggedFeedback]:
        return logged_feedback_rows(
            self.storage, self.tenant_id, self.upto_row, (k[1] for k in keys), self.page_rows
        )

    def training_examples(self, seed: int = 0, epoch: int = 0) -> Iterator[FimExample]:
        """One epoch's training examples in the window's order (`TrainingWindow.epoch`)."""
        for item in self._rows(self.window.epoch(seed, epoch)):
            yield as_example(item.feedback, self.baseline, self.scale)

    def stream(self, seed: int = 0) -> Callable[[], Iterator[FimExample]]:
        """A factory of the run's stream: epoch after epoch (the same sequence every time it is
        called; it ends at once when there is nothing to train on)."""

        def make() -> Iterator[FimExample]:
            for epoch in itertools.count():
                produced = 0
                for example in self.training_examples(seed, epoch):
                    produced += 1
                    yield example
                if produced == 0:
                    return

        return make

    def held_out(self) -> Iterator[LoggedFeedback]:
        """The held-out examples, oldest first."""
        return self._rows(reversed(self.window.held_out))

    def held_out_accepted(self, limit: int) -> list[FimExample]:
        """Up to `limit` held-out accepted suggestions as cursors to replay (the newest last),
        the whole suggestion being the text to reproduce."""
        kept: deque[FimExample] = deque(maxlen=max(limit, 0))
        for item in self.held_out():
            row = item.feedback
            if row.outcome != "accepted":
                continue
            kind = "block" if "\n" in row.suggestion.strip("\n") else "line"
            kept.append(FimExample(row.path, row.prefix, row.suggestion, row.suffix, kind))
        return list(kept)

    def summary(self) -> dict[str, Any]:
        return {
            "through_event_id": self.upto_row,
            "text_events": self.text_events,
            "training": self.train_count,
            "held_out": self.held_out_count,
            "positive": self.outcomes["positive"],
            "negative": self.outcomes["negative"],
            "reward_baseline": round(self.baseline, 4),
            "skipped": dict(self.skipped.most_common()),
        }


def text_decisions_after(
    storage: Storage, tenant_id: int, after_row: int, *, enough: int | None = None
) -> int:
    """How many shown, text-carrying decisions the tenant has after row `after_row` (counting
    stops at `enough`), in one query that reads no body into Python: the database counts the
    `show` decisions (their `label`) whose `prompt` and `suggestion` are non-empty strings."""
    carrying = (
        select(StoredEvent.id)
        .where(
            StoredEvent.tenant_id == tenant_id,
            StoredEvent.type == "decision",
            StoredEvent.id > after_row,
            StoredEvent.label == "show",
            StoredEvent.body["prompt"].as_string() != "",
            StoredEvent.body["suggestion"].as_string() != "",
        )
        .limit(enough)
        .subquery()
    )
    with storage.session() as session:
        count = session.scalar(select(func.count()).select_from(carrying))
    return int(count or 0)
