"""Forward tabloop's log records to the client as `window/logMessage` once it is connected."""

from __future__ import annotations

import asyncio
import logging
import threading

from lsprotocol import types

from lsp_server.server import TabloopServer

FORWARDED = ("lsp_server", "completion", "indexer", "telemetry")

LEVELS = {
    logging.ERROR: types.MessageType.Error,
    logging.WARNING: types.MessageType.Warning,
    logging.INFO: types.MessageType.Info,
    logging.DEBUG: types.MessageType.Log,
}


class ClientLogHandler(logging.Handler):
    """Sends records to the editor's output panel; safe from any thread."""

    def __init__(self, server: TabloopServer) -> None:
        super().__init__(logging.INFO)
        self.server = server
        self.loop: asyncio.AbstractEventLoop | None = None
        self._local = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        if not record.name.startswith(FORWARDED) or getattr(self._local, "busy", False):
            return
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        kind = LEVELS.get(record.levelno, types.MessageType.Log)
        params = types.LogMessageParams(type=kind, message=self.format(record))
        loop.call_soon_threadsafe(self._send, params)

    def _send(self, params: types.LogMessageParams) -> None:
        self._local.busy = True  # sending may log; don't loop
        try:
            self.server.window_log_message(params)
        except Exception:
            pass  # the client went away; stderr or the log file still has the record
        finally:
            self._local.busy = False


def attach_client_logging(server: TabloopServer) -> ClientLogHandler:
    """Install the handler; it starts forwarding once `initialized` arrives."""
    handler = ClientLogHandler(server)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(handler)

    def connected() -> None:
        handler.loop = asyncio.get_running_loop()

    server.add_feature(handler)
    server.hooks.settings.append(lambda _settings: connected())
    return handler
