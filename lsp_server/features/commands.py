"""The accept command and the status request."""

from __future__ import annotations

import logging
from typing import Any

from lsp_server.protocol import (
    ACCEPT_COMMAND,
    STATUS_REQUEST,
    TIMINGS_REQUEST,
    RequestTiming,
    ServerStatus,
)
from lsp_server.server import TabloopServer

log = logging.getLogger(__name__)


def register(server: TabloopServer) -> None:
    @server.command(ACCEPT_COMMAND)
    def accept(ls: TabloopServer, *args: Any) -> None:
        """The editor inserted a suggestion; arguments: [decisionId, ...]."""
        # pygls passes the command's arguments list as positional arguments.
        arguments = list(args[0]) if len(args) == 1 and isinstance(args[0], list) else list(args)
        decision_id = str(arguments[0]) if arguments else ""
        record = ls.decisions.get(decision_id)
        if record is None:
            log.warning("accept for an unknown decision %r", decision_id)
            return
        ls.counters.accepted += 1
        log.info(
            "accepted %s (%d chars, policy %s)",
            decision_id,
            len(record.decision.text),
            record.decision.policy_version,
        )
        for hook in ls.hooks.accept:
            try:
                hook(decision_id, arguments[1:])
            except Exception:
                log.exception("accept hook failed")

    @server.feature(STATUS_REQUEST)
    def status(ls: TabloopServer, params: Any) -> ServerStatus:
        return ls.status()

    @server.feature(TIMINGS_REQUEST)
    def timings(ls: TabloopServer, params: Any) -> list[RequestTiming]:
        """Recent per-request timings, oldest first (for benchmarks)."""
        return list(ls.request_timings)
