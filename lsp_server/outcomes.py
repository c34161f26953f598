"""What the user did with each suggestion, inferred from editor events.

`OutcomeTracker` is pure: it is told about decisions, document changes (`TextChange`: code-point
offsets, as `lsp_server.documents` records them), the accept command and the optional
`tabloop/didShow` / `tabloop/didDismiss` notifications, each with the time, and it emits
`OutcomeEvent`s and `RetentionEvent`s through a callback. Time-based outcomes (the ignore
timeout, retention checkpoints) fire from `tick(now)`; the server calls it at `next_deadline()`,
tests call it with any clock they like.

The rules, for a shown suggestion of text T inserted at offset P:

* the `tabloop.accept` command, or editor insertions at P that complete T: **accepted**;
* an insertion of two or more characters at the cursor that continues T (accept-word,
  accept-line): the accepted characters grow; when the suggestion ends any other way it ends as
  **partial** with those characters;
* a single typed character that continues T is typing through: it moves the cursor along T but is
  not acceptance;
* typing that diverges from T, or deleting at the cursor: **ignored** (`diverged`); an edit
  elsewhere or a request in another document: **ignored** (`moved`); closing the document:
  **ignored** (`closed`); no reaction for `ignore_after_s`: **ignored** (`timeout`);
* `tabloop/didDismiss`: **dismissed**; a newer request in the same document: **superseded**.

An explicit request may offer several candidates. The outcome belongs to the candidate on screen
when it happens (the first one, until `tabloop/didShow` or the accept command names another);
when it is decided, every other candidate the user saw is **ignored**, and one never cycled to is
**not_viewed** (it was not seen, so it was not turned down).

Accepted text is then followed through later edits (each edit maps the range's ends) and the
characters of it still present are measured 30, 120 and 600 seconds after acceptance. At the
first of these checkpoints the text the user kept in place of the suggestion (its typed-through
start and what the accepted range holds then, edits included) goes to the `kept` callback: a
held-out example of what the model should have written (`training.evaluate`).
"""

from __future__ import annotations

import difflib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lsp_server.documents import TextChange
from telemetry.events import (
    RETENTION_CHECKPOINTS_S,
    IgnoredReason,
    OutcomeEvent,
    OutcomeKind,
    RetentionEvent,
)

Emit = Callable[[OutcomeEvent | RetentionEvent], None]
Kept = Callable[[str, str], None]
"""(decision id, the text the user kept from the suggestion's offset on)."""


def map_start(offset: int, change: TextChange) -> int:
    """Where the start of a tracked range moves; text inserted at it lands before it."""
    if offset < change.start or (offset == change.start and change.end > change.start):
        return offset  # a replacement starting at the range's start stays inside it
    if offset >= change.end:
        return offset + change.delta
    return change.start + len(change.text)  # its first characters were replaced


def map_end(offset: int, change: TextChange) -> int:
    """Where the end of a tracked range moves; text inserted at it lands after it."""
    if offset <= change.start:
        return offset
    if offset >= change.end:
        return offset + change.delta
    return change.start  # its last characters were replaced


def retained_chars(accepted: str, current: str) -> int:
    """Characters of `accepted` still present, in order, in `current`."""
    if not accepted or not current:
        return 0
    matcher = difflib.SequenceMatcher(None, accepted, current, autojunk=False)
    return sum(block.size for block in matcher.get_matching_blocks())


@dataclass
class Pending:
    """A shown suggestion waiting for the user's reaction."""

    decision_id: str
    uri: str
    start: int  # offset of the suggestion in the document
    text: str
    decided_at: float
    shown_at: float | None = None
    cursor: int = 0  # characters of `text` now in the document (typed or accepted)
    accepted: int = 0  # of those, characters the editor inserted as acceptance
    accepted_from: int | None = None  # index into `text` of the first accepted character
    # Every candidate of the request as (decision id, text), the first one first, and those seen.
    candidates: list[tuple[str, str]] = field(default_factory=list)
    viewed: set[str] = field(default_factory=set)

    def switch_to(self, decision_id: str) -> bool:
        """Make the candidate `decision_id` the one on screen; False when it cannot be."""
        if decision_id == self.decision_id:
            return True
        text = dict(self.candidates).get(decision_id)
        typed = self.text[: self.cursor]
        if text is None or not text.startswith(typed):
            return False
        self.decision_id, self.text = decision_id, text
        self.viewed.add(decision_id)
        return True

    @property
    def anchor(self) -> float:
        return self.shown_at if self.shown_at is not None else self.decided_at


@dataclass
class Retention:
    """Accepted text followed through later edits until its last checkpoint."""

    decision_id: str
    uri: str
    start: int
    end: int
    accepted_text: str
    accepted_at: float
    checkpoints: list[int] = field(default_factory=lambda: list(RETENTION_CHECKPOINTS_S))
    awaiting: str = ""  # accepted by command before the editor inserted this remainder
    snapshot: str = ""  # the range's text when last seen, for closed documents
    typed: str = ""  # the suggestion's start typed through before the accepted range


class OutcomeTracker:
    """Infers outcomes and retention from the events of one language-server session."""

    def __init__(
        self,
        emit: Emit,
        *,
        ignore_after_s: float = 10.0,
        retention_time_scale: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        text_of: Callable[[str], str | None] = lambda uri: None,
        kept: Kept | None = None,
    ) -> None:
        self.emit = emit
        self.kept = kept
        self.ignore_after_s = ignore_after_s
        self.retention_time_scale = retention_time_scale
        self.clock = clock
        self.text_of = text_of
        self.pending: dict[str, Pending] = {}  # by uri: the one suggestion shown there
        self.retention: dict[str, Retention] = {}  # by decision id

    # -- inputs ---------------------------------------------------------------------------

    def decision(
        self,
        decision_id: str,
        uri: str,
        offset: int,
        text: str,
        shown: bool,
        now: float | None = None,
        alternatives: Sequence[tuple[str, str]] = (),
    ) -> None:
        """The server answered a request at `offset`; `shown` with `text`, or silent.

        `alternatives` are the request's other candidates as (decision id, text), in rank order.
        """
        now = self.clock() if now is None else now
        previous = self.pending.get(uri)
        if previous is not None:
            self._finish(previous, "superseded", now)
        for other in [p for p in self.pending.values() if p.uri != uri]:
            self._finish(other, "ignored", now, reason="moved")
        if shown and text:
            self.pending[uri] = Pending(
                decision_id,
                uri,
                offset,
                text,
                decided_at=now,
                candidates=[(decision_id, text), *alternatives],
                viewed={decision_id},
            )

    def shown(self, decision_id: str, now: float | None = None) -> None:
        """`tabloop/didShow`: the editor displayed the suggestion (or candidate) now."""
        pending = self._find(decision_id)
        if pending is None or not pending.switch_to(decision_id):
            return
        if pending.shown_at is None:
            pending.shown_at = self.clock() if now is None else now

    def dismissed(self, decision_id: str, now: float | None = None) -> None:
        """`tabloop/didDismiss`: the user closed the suggestion (Escape)."""
        pending = self._find(decision_id)
        if pending is not None:
            self._finish(pending, "dismissed", self.clock() if now is None else now)

    def accepted(self, decision_id: str, now: float | None = None) -> None:
        """The `tabloop.accept` command: the whole suggestion was accepted."""
        pending = self._find(decision_id)
        if pending is None or not pending.switch_to(decision_id):
            return
        now = self.clock() if now is None else now
        remainder = pending.text[pending.cursor :]
        if pending.accepted_from is None:
            pending.accepted_from = pending.cursor
        pending.accepted += len(remainder)
        pending.cursor = len(pending.text)
        retention = self._finish(pending, "accepted", now)
        if retention is not None:
            # The editor may run the command before it applies the edit: expect the insertion.
            retention.awaiting = remainder
            retention.end -= len(remainder)

    def opened(self, uri: str, now: float | None = None) -> None:
        """A document was (re)opened; retention of closed text there can no longer be mapped."""
        for retention in [r for r in self.retention.values() if r.uri == uri]:
            text = self.text_of(uri)
            if text is None or text[retention.start : retention.end] != retention.snapshot:
                del self.retention[retention.decision_id]

    def closed(self, uri: str, now: float | None = None) -> None:
        """A document was closed: its suggestion is ignored; its retention is frozen."""
        pending = self.pending.get(uri)
        if pending is not None:
            self._finish(pending, "ignored", self.clock() if now is None else now, reason="closed")

    def changed(self, uri: str, changes: Sequence[TextChange], now: float | None = None) -> None:
        """Edits applied to `uri`, in order, as code-point offsets of the text before each."""
        now = self.clock() if now is None else now
        for change in changes:
            # Ranges accepted before this change move with it; one this change accepts is
            # made after it, already in its coordinates.
            for retention in self.retention.values():
                if retention.uri == uri:
                    self._retention_change(retention, change)
            pending = self.pending.get(uri)
            if pending is not None:
                self._pending_change(pending, change, now)
        retained = [r for r in self.retention.values() if r.uri == uri]
        # Only then: the text of a big document is joined anew after each change.
        text = self.text_of(uri) if retained else None
        if text is not None:
            for retention in retained:
                retention.snapshot = text[retention.start : retention.end]

    # -- time ---------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """The earliest time at which `tick()` has something to do, or None."""
        times = [p.anchor + self.ignore_after_s for p in self.pending.values()]
        times += [self._due(r) for r in self.retention.values()]
        return min(times) if times else None

    def tick(self, now: float | None = None) -> None:
        """Fire every timeout and retention checkpoint due by `now`."""
        now = self.clock() if now is None else now
        for pending in list(self.pending.values()):
            if now >= pending.anchor + self.ignore_after_s:
                self._finish(pending, "ignored", now, reason="timeout")
        for retention in list(self.retention.values()):
            while retention.checkpoints and now >= self._due(retention):
                after_s = retention.checkpoints.pop(0)
                self._measure(retention, after_s)
            if not retention.checkpoints:
                del self.retention[retention.decision_id]

    # -- internals ----------------------------------------------------------------------

    def _due(self, retention: Retention) -> float:
        return retention.accepted_at + retention.checkpoints[0] / self.retention_time_scale

    def _find(self, decision_id: str) -> Pending | None:
        for pending in self.pending.values():
            if pending.decision_id == decision_id or any(
                candidate == decision_id for candidate, _ in pending.candidates
            ):
                return pending
        return None

    def _pending_change(self, pending: Pending, change: TextChange, now: float) -> None:
        at = pending.start + pending.cursor
        rest = pending.text[pending.cursor :]
        if change.start == change.end == at and change.text and rest.startswith(change.text):
            if len(change.text) == 1:
                pending.cursor += 1  # typing through
            else:
                if pending.accepted_from is None:
                    pending.accepted_from = pending.cursor
                pending.cursor += len(change.text)
                pending.accepted += len(change.text)
            if pending.cursor == len(pending.text) and pending.accepted:
                self._finish(pending, "accepted", now)
            return
        if change.end < pending.start or change.start > at:
            self._finish(pending, "ignored", now, reason="moved")
        else:
            self._finish(pending, "ignored", now, reason="diverged")

    def _retention_change(self, retention: Retention, change: TextChange) -> None:
        awaiting = retention.awaiting
        retention.awaiting = ""
        if awaiting and change.start == change.end == retention.end and change.text == awaiting:
            retention.end += len(awaiting)  # the accepted text arrives after the command
            return
        start = map_start(retention.start, change)
        end = map_end(retention.end, change)
        retention.start, retention.end = start, max(start, end)

    def _finish(
        self,
        pending: Pending,
        kind: OutcomeKind,
        now: float,
        reason: IgnoredReason | None = None,
    ) -> Retention | None:
        del self.pending[pending.uri]
        if pending.accepted and kind != "accepted":
            kind, reason = "partial", None  # it ended, but some of it was taken
        event = OutcomeEvent(
            decision_id=pending.decision_id,
            kind=kind,
            accepted_chars=pending.accepted if kind in ("accepted", "partial") else None,
            reason=reason if kind == "ignored" else None,
            time_to_outcome_ms=max(0.0, (now - pending.anchor) * 1000.0),
        )
        self.emit(event)
        for other, _text in pending.candidates:
            if other == pending.decision_id:
                continue
            seen = other in pending.viewed
            self.emit(
                OutcomeEvent(
                    decision_id=other,
                    kind="ignored" if seen else "not_viewed",
                    reason=(reason if kind == "ignored" else None) if seen else None,
                    time_to_outcome_ms=event.time_to_outcome_ms,
                )
            )
        if kind not in ("accepted", "partial") or pending.accepted_from is None:
            return None
        first = pending.accepted_from
        start = pending.start + first
        end = pending.start + pending.cursor
        accepted_text = pending.text[first : pending.cursor]
        retention = Retention(
            pending.decision_id,
            pending.uri,
            start,
            end,
            accepted_text,
            accepted_at=now,
            typed=pending.text[:first],
        )
        text = self.text_of(pending.uri)
        retention.snapshot = text[start:end] if text is not None else accepted_text
        self.retention[pending.decision_id] = retention
        return retention

    def _measure(self, retention: Retention, after_s: int) -> None:
        text = self.text_of(retention.uri)
        current = text[retention.start : retention.end] if text is not None else retention.snapshot
        kept = min(len(retention.accepted_text), retained_chars(retention.accepted_text, current))
        if self.kept is not None and after_s == RETENTION_CHECKPOINTS_S[0]:
            self.kept(retention.decision_id, retention.typed + current)
        self.emit(
            RetentionEvent(
                decision_id=retention.decision_id,
                after_s=after_s,
                accepted_chars=len(retention.accepted_text),
                retained_chars=kept,
            )
        )
