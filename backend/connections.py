"""How long a connection may hold the server without a request: uvicorn's h11 protocol with a
deadline on the request head.

uvicorn closes a kept-alive connection after `timeout_keep_alive` of silence, but only once a
response was sent, and not at all once a byte of the next request arrived: a client that
connects and sends nothing, or sends its headers a byte at a time (slowloris), holds the
connection for as long as it likes. `HeadDeadlineH11Protocol` starts a timer when a connection
opens and when a response completes, and closes the connection when a whole request head has
not arrived by then. The request's body has its own bound (`BodyLimits.read_timeout_s`, in
`backend/routes/body.py`); the head's size is bounded by h11 (`h11_max_incomplete_event_size`,
16 KiB by default: a larger head is answered 400).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

HEAD_TIMEOUT_S = 10.0
"""Longest wait for a whole request head, from the connection's start or the previous
response's end."""
KEEP_ALIVE_S = 5.0
"""uvicorn's `timeout_keep_alive`: an idle kept-alive connection is closed after this."""


class HeadDeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol; a request head must arrive within `head_timeout_s`."""

    head_timeout_s: float = HEAD_TIMEOUT_S

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None

    def _arm_head_deadline(self) -> None:
        self._cancel_head_deadline()
        self._head_deadline = self.loop.call_later(self.head_timeout_s, self._head_too_late)

    def _cancel_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_too_late(self) -> None:
        self._head_deadline = None
        if self._waiting_for_head() and not self.transport.is_closing():
            log.debug("closing a connection that sent no request head in %g s", self.head_timeout_s)
            self.transport.close()

    def _waiting_for_head(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_deadline()

    def handle_events(self) -> None:
        super().handle_events()
        if not self._waiting_for_head():  # a request's head arrived: the app has it now
            self._cancel_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self._waiting_for_head():
            self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        super().connection_lost(exc)


def server_options() -> dict[str, Any]:
    """The uvicorn options every backend server runs with (`uvicorn.run`, `uvicorn.Config`)."""
    return {"http": HeadDeadlineH11Protocol, "timeout_keep_alive": KEEP_ALIVE_S}
