"""Telemetry: decisions and the outcomes the session feature infers go to the telemetry client.

Everything here runs on the event loop and only enqueues: the client's `record()` costs
microseconds and its threads do the disk and network work. Decision events come from the decision
hook; outcome and retention events from `server.hooks.outcome` and `server.hooks.retention`
(`lsp_server.features.session` infers them); the editor's own telemetry switch arrives as
`tabloop/telemetryEnabled`.
"""

from __future__ import annotations

import logging
import math
import re
import threading
from typing import Any

from lsprotocol import types
from pydantic import ValidationError

from completion.types import CompletionRequest, Decision
from lsp_server.config import Settings
from lsp_server.features.adapters import AdapterFeature
from lsp_server.protocol import (
    TELEMETRY_ENABLED_NOTIFICATION,
    TelemetryEnabledParams,
    read_params,
)
from lsp_server.server import TabloopServer
from telemetry.client import TELEMETRY_DIR, TelemetryClient
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
    model_version: str | None = None,
) -> DecisionEvent:
    """The telemetry event of one decision (or one of `candidates`); text only at `full`.
    `client` is the editor's `clientInfo` from `initialize` (its name and version, cut to the
    schema's 64 characters). `model_version` names the adapter version that serves
    (`AdapterFeature.model_version`)."""
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
        model_version=model_version if model_version and _TOKEN.match(model_version) else None,
    )


def _finite(value: float | str) -> bool:
    return isinstance(value, str) or math.isfinite(value)


def _bounded(value: float | str) -> float | str:
    if isinstance(value, str):
        return value
    return min(MAX_FEATURE_MAGNITUDE, max(-MAX_FEATURE_MAGNITUDE, value))


def _millis(value: float) -> float:
    return value if math.isfinite(value) and 0 <= value <= 86_400_000 else 0.0


class TelemetryFeature:
    """Owns the telemetry client; only sends."""

    def __init__(self, server: TabloopServer) -> None:
        self.server = server
        self.client: TelemetryClient | None = None
        self._invalid_reported = False

    # -- settings and lifecycle ---------------------------------------------------------------

    def on_settings(self, settings: Settings) -> None:
        """Create the client on first configuration; follow later changes."""
        wanted = settings.telemetry
        client = self.client
        if client is not None and _client_fields(client.settings) == _client_fields(wanted):
            if client.settings.client_enabled != wanted.client_enabled:
                client.set_client_enabled(wanted.client_enabled)
            if client.settings.level != wanted.level:
                client.set_level(wanted.level)
            return
        if client is not None:
            self._retire(client)
        self.client = TelemetryClient(wanted, settings.cache_path() / TELEMETRY_DIR)
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

    def record(self, event: OutcomeEvent | RetentionEvent) -> None:
        """An outcome or retention measure the session feature inferred: sent as it is."""
        if self.client is not None:
            self.client.record(event)

    def on_decision(self, decision: Decision, request: CompletionRequest) -> None:
        client = self.client
        candidates = [decision, *decision.alternatives] if decision.shown else [decision]
        if client is not None and client.level != "off":
            adapters = self.server.find_feature(AdapterFeature)
            for candidate in candidates:
                model_version = adapters.version_of(candidate) if adapters is not None else None
                try:
                    event = decision_event(
                        candidate,
                        request,
                        session_id=client.session_id,
                        install_id=client.install_id,
                        level=client.level,
                        candidates=len(candidates),
                        client=self.server.client_info,
                        model_version=model_version,
                    )
                except ValidationError as exc:
                    if not self._invalid_reported:
                        self._invalid_reported = True
                        log.warning("a decision could not be made into an event: %s", exc)
                else:
                    client.record(event)


def _client_fields(settings: TelemetrySettings) -> tuple[Any, ...]:
    return tuple(getattr(settings, name) for name in CLIENT_FIELDS)


def register(server: TabloopServer) -> None:
    feature = server.add_feature(TelemetryFeature(server))
    server.hooks.settings.append(feature.on_settings)
    server.hooks.decision.append(feature.on_decision)
    server.hooks.outcome.append(feature.record)
    server.hooks.retention.append(feature.record)
    server.hooks.shutdown.append(feature.on_shutdown)

    @server.feature(TELEMETRY_ENABLED_NOTIFICATION)
    def telemetry_enabled(ls: TabloopServer, params: Any) -> None:
        """The editor's telemetry switch changed."""
        switch = read_params(params, TelemetryEnabledParams)
        if switch is not None:
            feature.set_client_enabled(switch.enabled)
