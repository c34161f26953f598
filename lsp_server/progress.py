"""One `$/progress` (work-done progress) run in the editor: begin, reports, end.

Loading the model, indexing the workspace and preparing an adapter each show one. A client that
takes no progress, or refuses the token, sees nothing, and the calls here do nothing.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import TYPE_CHECKING

from lsprotocol import types

if TYPE_CHECKING:
    from lsp_server.server import TabloopServer

log = logging.getLogger(__name__)


class WorkDoneProgress:
    """A progress token of the server's own, named `{prefix}{8 hex digits}`."""

    def __init__(self, server: TabloopServer, token_prefix: str, title: str) -> None:
        self.server = server
        self.token = f"{token_prefix}{uuid.uuid4().hex[:8]}"
        self.title = title
        self.active = False
        self._ended: str | None = None  # `end` came while `begin` still waited for the client

    async def begin(self, message: str, percentage: int | None = None) -> bool:
        """Create the token and send `begin`; False when the client takes no progress."""
        if not self.server.client.work_done_progress:
            return False
        try:
            await self.server.work_done_progress.create_async(self.token)
            self.server.work_done_progress.begin(
                self.token,
                types.WorkDoneProgressBegin(
                    title=self.title, message=message, percentage=percentage
                ),
            )
        except Exception:
            log.debug("client refused work-done progress", exc_info=True)
            return False
        self.active = True
        if self._ended is not None:
            self.end(self._ended)
        return True

    def report(self, message: str, percentage: int | None = None) -> None:
        """A step, on the event loop."""
        if self.active:
            self.server.work_done_progress.report(
                self.token, types.WorkDoneProgressReport(message=message, percentage=percentage)
            )

    def report_from_thread(self, loop: asyncio.AbstractEventLoop, message: str) -> None:
        """A step, from a worker thread: sent on `loop`."""
        if self.active:
            loop.call_soon_threadsafe(self.report, message)

    def end(self, message: str) -> None:
        """The work is done (or failed): the editor closes the progress."""
        if not self.active:
            self._ended = message
            return
        self.active = False
        self.server.work_done_progress.end(self.token, types.WorkDoneProgressEnd(message=message))
