"""The simulated user's editing session, told to the server's own session code.

The replay does not build its telemetry itself: what the simulated user does becomes editor
events (keystrokes, the accept command, accept-word insertions, corrections) given to the same
objects the language server uses (`completion.session.SessionSignals` for the gate's session
signals, `lsp_server.outcomes.OutcomeTracker` for outcomes and retention,
`lsp_server.features.telemetry.decision_event` for decision events). So the features the trainer
learns from and the events it reads mean what they mean when the server makes them.

Time is simulated: the typist types `SECONDS_PER_CHAR` per character between positions; the
outcome of a shown suggestion is settled at once (its retention measured at every checkpoint on
the text as the user left it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from completion import gate
from completion.session import SessionSignals
from completion.types import CompletionRequest, Decision
from evaluation.simulation import Position, UserResponse
from lsp_server.features.telemetry import decision_event
from lsp_server.outcomes import OutcomeTracker, TextChange
from telemetry.events import (
    RETENTION_CHECKPOINTS_S,
    DecisionEvent,
    OutcomeEvent,
    RetentionEvent,
)
from telemetry.settings import Level

SECONDS_PER_CHAR = 0.2  # the simulated typist: 5 characters a second
# Long enough after a decision for every retention checkpoint to have fired.
SETTLE_S = max(RETENTION_CHECKPOINTS_S) + 1.0

Event = DecisionEvent | OutcomeEvent | RetentionEvent


@dataclass
class EditingSession:
    """One simulated editing session: a clock, the session signals and the outcome tracker."""

    session_id: str = "replay"
    install_id: str = "replay"
    level: Level = "metrics"
    clock_s: float = 0.0
    signals: SessionSignals = field(init=False)
    events: list[Event] = field(default_factory=list)
    _path: str = ""
    _typed_to: int = 0
    _text: str = ""

    def __post_init__(self) -> None:
        self.signals = SessionSignals(clock=lambda: self.clock_s)
        self.tracker = OutcomeTracker(self._emit, clock=lambda: self.clock_s, text_of=self._text_of)

    def _emit(self, event: OutcomeEvent | RetentionEvent) -> None:
        if isinstance(event, OutcomeEvent):
            self.signals.outcome(event.kind, now=self.clock_s)
        self.events.append(event)

    def _text_of(self, uri: str) -> str | None:
        return self._text

    @staticmethod
    def uri(position: Position) -> str:
        return Path(position.path).as_uri()

    def arrive(self, position: Position) -> gate.Signals:
        """The typist reaches `position`, typing what lies between the last one and it; returns
        the session's signals for the request made there."""
        uri = self.uri(position)
        if position.path != self._path:  # a new file: opened, typing starts there
            self._path, self._typed_to = position.path, 0
            self.signals.opened(uri)
            self.tracker.opened(uri)
        gap = max(0, len(position.prefix) - self._typed_to)
        self._typed_to = len(position.prefix)
        start = self.clock_s
        # One keystroke per character, as an editor reports them; only the last few can be
        # inside the typing window, so older ones are not replayed one by one.
        window = int(10 / SECONDS_PER_CHAR)
        if gap > window:
            self.signals.typed(uri, gap - window, now=start)
        for i in range(1, min(gap, window) + 1):
            self.signals.typed(uri, 1, now=start + SECONDS_PER_CHAR * (gap - min(gap, window) + i))
        self.clock_s = start + SECONDS_PER_CHAR * gap
        self._text = position.prefix + position.suffix
        return self.signals.signals(uri, now=self.clock_s)

    def decided(
        self, position: Position, request: CompletionRequest, decision: Decision
    ) -> DecisionEvent:
        """The server's decision event for `decision`, recorded."""
        event = decision_event(
            decision,
            request,
            session_id=self.session_id,
            install_id=self.install_id,
            level=self.level,
        )
        self.events.append(event)
        self.tracker.decision(
            decision.decision_id,
            self.uri(position),
            len(position.prefix),
            decision.text,
            shown=decision.shown,
            now=self.clock_s,
        )
        return event

    def respond(self, position: Position, decision: Decision, response: UserResponse) -> None:
        """What the user does with a shown suggestion, as editor events; settles its outcome."""
        uri = self.uri(position)
        cursor = len(position.prefix)
        text = decision.text
        now = self.clock_s
        if response.kind == "accepted":
            self.tracker.accepted(decision.decision_id, now=now)
            self._edit(uri, TextChange(cursor, cursor, text), now)
            if response.retained_chars < len(text):  # the wrong end is deleted
                end = cursor + len(text)
                self._edit(uri, TextChange(cursor + response.retained_chars, end, ""), now)
        elif response.kind == "partial":
            taken = text[: response.accepted_chars]
            self._edit(uri, TextChange(cursor, cursor, taken), now)  # accept word(s)
            self.tracker.dismissed(decision.decision_id, now=now)  # then the rest is closed
        else:
            # The user types on: through the characters the suggestion got right, then one
            # that it did not (or, when the suggestion is all right but too short to take,
            # nothing more: it times out).
            hole = position.hole
            at = cursor
            for ch in hole:
                self._edit(uri, TextChange(at, at, ch), now)
                at += 1
                if self.tracker.pending.get(uri) is None:
                    break
        # Whatever is still open times out; every retention checkpoint is measured.
        self.tracker.tick(now + SETTLE_S)

    def _edit(self, uri: str, change: TextChange, now: float) -> None:
        self._text = self._text[: change.start] + change.text + self._text[change.end :]
        if change.text:
            self.signals.typed(uri, len(change.text), now=now)
        self.tracker.changed(uri, [change], now=now)
