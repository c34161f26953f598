"""The user's session as the gate sees it: one definition for the server and the replay.

`SessionSignals` is told what the user typed (per document) and what became of each shown
suggestion, and answers the `Signals` of the next decision:

- `typing_speed_cps`: characters typed in the document during the last `TYPING_WINDOW_S`
  seconds, divided by that window;
- `recent_accept_rate`: of the last `RECENT_OUTCOMES` shown suggestions that have an outcome,
  the share accepted whole or in part (0 before the first outcome);
- `seconds_since_last_accept`: since the last whole or partial acceptance (`NEVER_S` before one).

The language server feeds it from `didChange` and from the outcomes its tracker infers; the replay
feeds it from its simulated typist and user on a simulated clock. The trainer reads the values
back from the logged features, so a feature means the same thing wherever it was made.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from completion.gate import Signals

TYPING_WINDOW_S = 5.0
RECENT_OUTCOMES = 20
NEVER_S = 1e6
ACCEPTED_KINDS = frozenset({"accepted", "partial"})
# Outcomes that say what the user did with a suggestion they saw; others (superseded, not
# viewed) say nothing about the user and leave the rate alone.
JUDGED_KINDS = ACCEPTED_KINDS | {"ignored", "dismissed"}


class SessionSignals:
    """Typing speed per document and the recent outcomes of a session; thread-safe.

    `clock` gives seconds (monotonic in the server, simulated in the replay); every method also
    takes an explicit `now`.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        # Per document: (time, characters inserted, `latency.edit_kind`) of each recent edit.
        self._typed: dict[str, deque[tuple[float, int, str]]] = {}
        self._outcomes: deque[bool] = deque(maxlen=RECENT_OUTCOMES)
        self._last_accept: float | None = None
        self._lock = threading.Lock()

    def opened(self, uri: str) -> None:
        """A document was opened: its typing starts afresh."""
        with self._lock:
            self._typed[uri] = deque(maxlen=256)

    def closed(self, uri: str) -> None:
        with self._lock:
            self._typed.pop(uri, None)

    def typed(self, uri: str, chars: int, now: float | None = None, kind: str = "") -> None:
        """`chars` characters were inserted into the document (one edit, of `kind`)."""
        at = self.clock() if now is None else now
        with self._lock:
            self._typed.setdefault(uri, deque(maxlen=256)).append((at, chars, kind))

    def edits(self, uri: str) -> list[tuple[float, str]]:
        """When the document's recent edits happened and what each was (`latency.edit_kind`;
        empty when not told), oldest first."""
        with self._lock:
            return [(at, kind) for at, _, kind in self._typed.get(uri, ())]

    def outcome(self, kind: str, now: float | None = None) -> None:
        """A shown suggestion's outcome (`telemetry.events.OutcomeKind`)."""
        if kind not in JUDGED_KINDS:
            return
        accepted = kind in ACCEPTED_KINDS
        with self._lock:
            self._outcomes.append(accepted)
            if accepted:
                self._last_accept = self.clock() if now is None else now

    def signals(self, uri: str, now: float | None = None) -> Signals:
        """The session part of the next decision's `Signals` in document `uri`."""
        # Imported here: the server imports this module before `initialize` answers, and the
        # gate brings numpy.
        from completion.gate import Signals

        at = self.clock() if now is None else now
        with self._lock:
            recent = sum(
                n for t, n, _ in self._typed.get(uri, ()) if 0 <= at - t <= TYPING_WINDOW_S
            )
            outcomes = list(self._outcomes)
            last = self._last_accept
        return Signals(
            typing_speed_cps=recent / TYPING_WINDOW_S,
            seconds_since_last_accept=NEVER_S if last is None else min(NEVER_S, at - last),
            recent_accept_rate=sum(outcomes) / len(outcomes) if outcomes else 0.0,
        )
