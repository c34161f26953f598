"""The user's session in the server: how they type, and what they did with each suggestion.

`SessionFeature` owns the session signals the gate reads (`completion.session.SessionSignals`,
fed by `TypingTracker` from the document stream and by each outcome) and outcome inference
(`lsp_server.outcomes.OutcomeTracker`), which is told about decisions (decision hook), document
changes (document listener), the accept command (accept hook) and the optional
`tabloop/didShow` and `tabloop/didDismiss` notifications; its timers run with `loop.call_later`.
Each outcome goes to the session signals, then to `server.hooks.outcome` (telemetry sends it,
learning keeps it); each retention measurement to `server.hooks.retention`. Nothing here depends
on telemetry being on, or registered.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from completion.latency import edit_kind, likely_pause_ms
from completion.session import SessionSignals
from completion.types import CompletionRequest, Decision
from lsp_server.config import Settings
from lsp_server.documents import DocumentChange, DocumentListener, open_document
from lsp_server.outcomes import OutcomeTracker
from lsp_server.protocol import (
    DID_DISMISS_NOTIFICATION,
    DID_SHOW_NOTIFICATION,
    DecisionParams,
    read_params,
)
from lsp_server.server import TabloopServer
from telemetry.events import OutcomeEvent, RetentionEvent

log = logging.getLogger(__name__)


class TypingTracker(DocumentListener):
    """Feeds the session's signals (`completion.session`) from document events."""

    def __init__(self, session: SessionSignals) -> None:
        self.session = session

    def did_open(self, uri: str) -> None:
        self.session.opened(uri)

    def did_change(self, change: DocumentChange) -> None:
        edits = [edit for edit in change.edits if not edit.whole]
        typed = sum(len(edit.text) for edit in edits)
        kind = edit_kind(edits[-1].text) if edits else "other"
        self.session.typed(change.uri, typed, kind=kind)

    def did_close(self, uri: str) -> None:
        self.session.closed(uri)

    def likely_pause_ms(self, uri: str) -> float | None:
        """How long the user will probably pause after their latest edit (None: unknown)."""
        edits = self.session.edits(uri)
        return likely_pause_ms(
            [at for at, _ in edits], self.session.clock(), [kind for _, kind in edits]
        )


class SessionFeature(DocumentListener):
    """Owns the session signals and the outcome tracker, and the tracker's timers."""

    def __init__(self, server: TabloopServer, clock: Callable[[], float] = time.monotonic) -> None:
        self.server = server
        self.session = SessionSignals(clock=clock)
        self.typing = TypingTracker(self.session)
        self.tracker = OutcomeTracker(self.emit, clock=clock, text_of=self._text_of, kept=self.kept)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf

    def on_settings(self, settings: Settings) -> None:
        self.tracker.ignore_after_s = settings.telemetry.ignore_after_s
        self.tracker.retention_time_scale = settings.telemetry.retention_time_scale

    def on_shutdown(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    # -- what the tracker infers ----------------------------------------------------------

    def emit(self, event: OutcomeEvent | RetentionEvent) -> None:
        """An outcome (to the session signals, then the outcome hooks) or a retention measure."""
        if isinstance(event, RetentionEvent):
            for retention_hook in self.server.hooks.retention:
                try:
                    retention_hook(event)
                except Exception:
                    log.exception("retention hook failed")
            return
        self.session.outcome(event.kind)
        for hook in self.server.hooks.outcome:
            try:
                hook(event)
            except Exception:
                log.exception("outcome hook failed")

    def kept(self, decision_id: str, text: str) -> None:
        """The text kept in place of an accepted suggestion, to the kept hooks."""
        for hook in self.server.hooks.kept:
            try:
                hook(decision_id, text)
            except Exception:
                log.exception("kept hook failed")

    # -- what it is told --------------------------------------------------------------------

    def on_decision(self, decision: Decision, request: CompletionRequest) -> None:
        alternatives = decision.alternatives if decision.shown else []
        self.tracker.decision(
            decision.decision_id,
            request.uri,
            len(request.prefix),
            decision.text,
            shown=decision.shown,
            alternatives=[(c.decision_id, c.text) for c in alternatives],
        )
        self._schedule()

    def on_accept(self, decision_id: str, _arguments: list[Any]) -> None:
        self.tracker.accepted(decision_id)
        self._schedule()

    def on_show(self, decision_id: str) -> None:
        self.tracker.shown(decision_id)
        self._schedule()

    def on_dismiss(self, decision_id: str) -> None:
        self.tracker.dismissed(decision_id)
        self._schedule()

    # -- documents (a DocumentListener) ---------------------------------------------------

    def _text_of(self, uri: str) -> str | None:
        document = open_document(self.server.workspace, uri)
        return document.source if document is not None else None

    def did_open(self, uri: str) -> None:
        self.typing.did_open(uri)
        self.tracker.opened(uri)

    def did_change(self, change: DocumentChange) -> None:
        self.typing.did_change(change)
        self.tracker.changed(change.uri, change.edits)
        self._schedule()

    def did_close(self, uri: str) -> None:
        self.typing.did_close(uri)
        self.tracker.closed(uri)
        self._schedule()

    # -- timers -----------------------------------------------------------------------------

    def _schedule(self) -> None:
        deadline = self.tracker.next_deadline()
        if deadline is None or deadline >= self._timer_at:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (direct use): the caller ticks
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        delay = max(0.0, deadline - self.tracker.clock())
        self._timer = loop.call_later(delay, self._tick)

    def _tick(self) -> None:
        self._timer, self._timer_at = None, math.inf
        try:
            self.tracker.tick()
        except Exception:
            log.exception("outcome tracker failed")
        self._schedule()


def register(server: TabloopServer) -> None:
    feature = server.add_feature(SessionFeature(server))
    server.hooks.settings.append(feature.on_settings)
    server.hooks.decision.append(feature.on_decision)
    server.hooks.accept.append(feature.on_accept)
    server.hooks.documents.append(feature)
    server.hooks.shutdown.append(feature.on_shutdown)

    @server.feature(DID_SHOW_NOTIFICATION)
    def did_show(ls: TabloopServer, params: Any) -> None:
        """The client displayed a suggestion."""
        shown = read_params(params, DecisionParams)
        if shown is not None:
            feature.on_show(shown.decision_id)

    @server.feature(DID_DISMISS_NOTIFICATION)
    def did_dismiss(ls: TabloopServer, params: Any) -> None:
        """The user dismissed a suggestion."""
        dismissed = read_params(params, DecisionParams)
        if dismissed is not None:
            feature.on_dismiss(dismissed.decision_id)
