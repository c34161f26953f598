"""Forward tabloop's log records to the client as `window/logMessage` once it is connected.

This is where the server's INFO lines go in an editor: its stderr gets only warnings and errors
(`lsp_server.main.configure_logging`), because editors keep all of stderr (Neovim files each line
as an error). The log (the client's, and `--log-file`) holds what the client asks for: records
from its `logLevel` setting up (info by default), and debug ones too while its trace is `verbose`
(initialize's `trace`, `$/setTrace`) or the server runs with `-vv`.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from lsprotocol import types

from lsp_server.config import Settings
from lsp_server.server import TabloopServer

FORWARDED = ("lsp_server", "completion", "indexer", "telemetry", "training", "common")

LEVELS = {
    logging.ERROR: types.MessageType.Error,
    logging.WARNING: types.MessageType.Warning,
    logging.INFO: types.MessageType.Info,
    logging.DEBUG: types.MessageType.Log,
}


class ClientLogHandler(logging.Handler):
    """Sends records to the editor's output panel; safe from any thread."""

    def __init__(self, server: TabloopServer, floor: int = logging.INFO) -> None:
        super().__init__()  # the loggers choose the level (`follow`)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self.server = server
        self.floor = floor  # the command line's level: debug (-vv) whatever the client asks
        self.loop: asyncio.AbstractEventLoop | None = None
        self._local = threading.local()

    def follow(self, log_level: str, trace: types.TraceValue) -> None:
        """Let tabloop's loggers through from `log_level` up, or from debug up while the client
        traces verbosely or the command line asked for debug."""
        wanted = logging.getLevelNamesMapping().get(log_level.upper(), logging.INFO)
        if trace == types.TraceValue.Verbose or self.floor <= logging.DEBUG:
            wanted = logging.DEBUG
        for name in FORWARDED:
            logging.getLogger(name).setLevel(wanted)

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


def attach_client_logging(server: TabloopServer, floor: int = logging.INFO) -> ClientLogHandler:
    """Install the handler; it starts forwarding once the settings are read (`initialize`)."""
    handler = ClientLogHandler(server, floor)
    logging.getLogger().addHandler(handler)

    def connected(settings: Settings) -> None:
        handler.follow(settings.log_level, server.protocol.trace)
        handler.loop = asyncio.get_running_loop()

    @server.feature(types.SET_TRACE)
    def set_trace(ls: TabloopServer, params: types.SetTraceParams) -> None:
        handler.follow(ls.settings.log_level, params.value)

    server.add_feature(handler)
    server.hooks.settings.append(connected)
    return handler
