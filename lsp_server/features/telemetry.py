"""Telemetry wiring: decisions and inferred outcomes go to the telemetry client.

Everything here runs on the event loop and only enqueues: the client's `record()` costs
microseconds and its threads do the disk and network work. The outcome tracker is told about
decisions (decision hook), document edits (document listener: the document store's changes in
code points), the accept command (accept hook) and the optional
`tabloop/didShow`, `tabloop/didDismiss` and `tabloop/telemetryEnabled` notifications; its
timers run with `loop.call_later`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import threading
from typing import Any

from lsprotocol import types
from pydantic import ValidationError

from completion.session import SessionSignals
from completion.types import CompletionRequest, Decision
from lsp_server.config import Settings
from lsp_server.documents import DocumentChange, DocumentListener, open_document
from lsp_server.outcomes import OutcomeTracker
from lsp_server.protocol import (
    DID_DISMISS_NOTIFICATION,
    DID_SHOW_NOTIFICATION,
    TELEMETRY_ENABLED_NOTIFICATION,
    DecisionParams,
    TelemetryEnabledParams,
    read_params,
)
from lsp_server.server import TabloopServer
from telemetry.client import TelemetryClient
from telemetry.events import (
    MAX_FEATURE_MAGNITUDE,
    MAX_TEXT_CHARS,
    MIN_PROPENSITY,
    DecisionEvent,
    Latency,
    OutcomeEvent,
    RetentionEvent,
)
from telemetry.privacy import scrub_features
from telemetry.settings import Level, TelemetrySettings

log = logging.getLogger(__name__)

# Settings whose change needs a new client (a new spool or sender).
CLIENT_FIELDS = (
    "backend_url",
    "token",
    "spool_max_events",
    "spool_max_bytes",
    "queue_max_events",
    "batch_size",
    "flush_interval_s",
    "request_timeout_s",
    "retry_deadline_s",
    "backoff_initial_s",
    "backoff_max_s",
)
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_TOKEN = re.compile(r"^[A-Za-z0-9_.:+#/-]{1,128}$")


def event_features(features: dict[str, float | str]) -> dict[str, float | str]:
    """Features as the schema accepts them: sane names, finite numbers within the schema's bound
    (clipped: a count past it still says "very large"), categories only."""
    named = {k: v for k, v in features.items() if _NAME.match(k)}
    return {k: _bounded(v) for k, v in scrub_features(named).items() if _finite(v)}


def decision_event(
    decision: Decision,
    request: CompletionRequest,
    *,
    session_id: str,
    install_id: str,
    level: Level,
    candidates: int = 1,
    client: types.ClientInfo | None = None,
) -> DecisionEvent:
    """The telemetry event of one decision (or one of `candidates`); text only at `full`.
    `client` is the editor's `clientInfo` from `initialize` (its name and version, cut to the
    schema's 64 characters)."""
    text = decision.text
    full = level == "full"
    return DecisionEvent(
        decision_id=decision.decision_id,
        session_id=session_id,
        install_id=install_id,
        language=request.language
        if re.match(r"^[A-Za-z0-9_.+#-]{0,64}$", request.language)
        else "other",
        trigger=request.trigger,
        policy_version=decision.policy_version
        if _TOKEN.match(decision.policy_version)
        else "unknown",
        model_id=decision.model_id[:200],
        action=decision.action,
        # The schema refuses 0: a policy's propensity is never below its exploration floor, and a
        # rounding to 0 must not cost the event.
        propensity=min(1.0, max(MIN_PROPENSITY, decision.propensity)),
        features=event_features(decision.features),
        suggestion_chars=len(text),
        suggestion_lines=text.count("\n") + 1 if text else 0,
        latency=Latency(
            context_ms=_millis(decision.timings.context_ms),
            model_ms=_millis(decision.timings.model_ms),
            total_ms=_millis(decision.timings.total_ms),
        ),
        cache_hit=decision.cache_hit,
        prompt=request.prefix[-MAX_TEXT_CHARS:] if full else None,
        suggestion=text[:MAX_TEXT_CHARS] if full else None,
        silence_reason=decision.silence_reason if decision.action == "silence" else None,
        request_id=decision.request_id if candidates > 1 else None,
        rank=decision.rank,
        candidates=candidates,
        client_name=client.name[:64] if client is not None else None,
        client_version=client.version[:64] if client is not None and client.version else None,
    )


def _finite(value: float | str) -> bool:
    return isinstance(value, str) or math.isfinite(value)


def _bounded(value: float | str) -> float | str:
    if isinstance(value, str):
        return value
    return min(MAX_FEATURE_MAGNITUDE, max(-MAX_FEATURE_MAGNITUDE, value))


def _millis(value: float) -> float:
    return value if math.isfinite(value) and 0 <= value <= 86_400_000 else 0.0


class TelemetryFeature(DocumentListener):
    """Owns the telemetry client and the outcome tracker."""

    def __init__(self, server: TabloopServer) -> None:
        self.server = server
        self.client: TelemetryClient | None = None
        self.tracker = OutcomeTracker(self.record, text_of=self._text_of)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._invalid_reported = False

    # -- settings and lifecycle ---------------------------------------------------------------

    def on_settings(self, settings: Settings) -> None:
        """Create the client on first configuration; follow later changes."""
        wanted = settings.telemetry
        self.tracker.ignore_after_s = wanted.ignore_after_s
        self.tracker.retention_time_scale = wanted.retention_time_scale
        client = self.client
        if client is not None and _client_fields(client.settings) == _client_fields(wanted):
            if client.settings.client_enabled != wanted.client_enabled:
                client.set_client_enabled(wanted.client_enabled)
            if client.settings.level != wanted.level:
                client.set_level(wanted.level)
            return
        if client is not None:
            self._retire(client)
        self.client = TelemetryClient(wanted, settings.cache_path() / "telemetry")
        try:
            self.client.start()  # no-op while the level is off
        except Exception:
            # A spool we cannot open (locked for long, unwritable) must not stop the server.
            log.warning("telemetry disabled: could not open the spool", exc_info=True)
            self.client = None
            return
        log.info("telemetry level %s, backend %s", self.client.level, wanted.backend_url or "none")

    def set_client_enabled(self, enabled: bool) -> None:
        """The editor's own telemetry switch changed."""
        if self.client is not None:
            self.client.set_client_enabled(enabled)

    def on_shutdown(self) -> None:
        """Commit what is queued now; send for the configured time in the background."""
        if self._timer is not None:
            self._timer.cancel()
        if self.client is not None:
            self.client.flush_to_spool(1.0)
            self._retire(self.client)
            self.client = None

    @staticmethod
    def _retire(client: TelemetryClient) -> None:
        # Never make the editor wait: spooled events not sent now are sent next time.
        closer = threading.Thread(target=client.shutdown, name="tabloop-telemetry-close")
        closer.daemon = True
        closer.start()

    def status_parts(self) -> dict[str, Any]:
        """The client's counters: the `telemetry` part of `tabloop/status`."""
        return {"telemetry": self.client.stats() if self.client else {"level": "off"}}

    # -- recording --------------------------------------------------------------------------

    def record(self, event: OutcomeEvent | RetentionEvent | DecisionEvent) -> None:
        if isinstance(event, OutcomeEvent):
            session = self.server.find_feature(SessionSignals)
            if session is not None:
                session.outcome(event.kind)
        if self.client is not None:
            self.client.record(event)
        if isinstance(event, OutcomeEvent):
            for hook in self.server.hooks.outcome:
                try:
                    hook(event)
                except Exception:
                    log.exception("outcome hook failed")

    def on_decision(self, decision: Decision, request: CompletionRequest) -> None:
        client = self.client
        candidates = [decision, *decision.alternatives] if decision.shown else [decision]
        if client is not None and client.level != "off":
            for candidate in candidates:
                try:
                    event = decision_event(
                        candidate,
                        request,
                        session_id=client.session_id,
                        install_id=client.install_id,
                        level=client.level,
                        candidates=len(candidates),
                        client=self.server.client_info,
                    )
                except ValidationError as exc:
                    if not self._invalid_reported:
                        self._invalid_reported = True
                        log.warning("a decision could not be made into an event: %s", exc)
                else:
                    client.record(event)
        self.tracker.decision(
            decision.decision_id,
            request.uri,
            len(request.prefix),
            decision.text,
            shown=decision.shown,
            alternatives=[(c.decision_id, c.text) for c in candidates[1:]],
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
        self.tracker.opened(uri)

    def did_change(self, change: DocumentChange) -> None:
        self.tracker.changed(change.uri, change.edits)
        self._schedule()

    def did_close(self, uri: str) -> None:
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


def _client_fields(settings: TelemetrySettings) -> tuple[Any, ...]:
    return tuple(getattr(settings, name) for name in CLIENT_FIELDS)


def register(server: TabloopServer) -> None:
    feature = server.add_feature(TelemetryFeature(server))
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

    @server.feature(TELEMETRY_ENABLED_NOTIFICATION)
    def telemetry_enabled(ls: TabloopServer, params: Any) -> None:
        """The editor's telemetry switch changed."""
        switch = read_params(params, TelemetryEnabledParams)
        if switch is not None:
            feature.set_client_enabled(switch.enabled)
