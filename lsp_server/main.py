"""Starting the language server: logging, transport arguments, and `serve`.

Shared by `python -m lsp_server` and `tabloop serve`. Under `serve`, stdout carries JSON-RPC only.
Logs go to the client (`window/logMessage`, at the level it asks for: `lsp_server.logging_bridge`)
and to `--log-file` when given. stderr gets warnings and errors only, unless `-v` asks for more:
editors keep what a server writes there, and Neovim files all of it as errors.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from lsp_server import __version__

log = logging.getLogger(__name__)

LISTENING_MESSAGE = "tabloop language server listening"


def configure_logging(verbosity: int, log_file: str | None = None) -> int:
    """Logs to stderr (never stdout, which may carry JSON-RPC) and to `log_file` when given; the
    least severe level the log holds (info, `-vv`: debug), which the client's handler is given.

    stderr gets warnings and errors (`-v`: info too, `-vv`: debug). The log file, like the client,
    gets what the server's loggers let through (`lsp_server.logging_bridge`).
    """
    level = logging.DEBUG if verbosity >= 2 else logging.INFO
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    stderr = logging.StreamHandler(sys.stderr)
    stderr.setLevel(level if verbosity >= 1 else logging.WARNING)
    handlers: list[logging.Handler] = [stderr]
    if log_file:
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = handlers
    root.setLevel(level)
    # pygls logs every message it sends at INFO, httpx every request it makes: keep that for -vv.
    for chatty in ("pygls", "httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(level if verbosity >= 2 else logging.WARNING)
    rpc = logging.getLogger("pygls.protocol.json_rpc")
    if not any(isinstance(f, RoutineCancels) for f in rpc.filters):
        rpc.addFilter(RoutineCancels())
    return level


class RoutineCancels(logging.Filter):
    """pygls warns of a `$/cancelRequest` for a request it does not know: one it has answered
    already, which is routine (the editor cancels what it no longer needs while the answer is
    on its way). Such a record is passed on at debug, so stderr, which editors file as errors,
    does not get it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and str(record.msg).startswith(
            "Cancel notification for unknown message id"
        ):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def quiet_progress_bars() -> None:
    """No terminal progress bars in the server (Hugging Face's "Loading weights", downloads):
    its stderr is the editor's log. Set before those libraries are imported; a value the user
    set is kept. The CLI's own commands (`tabloop index`) keep theirs."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # huggingface_hub, transformers
    os.environ.setdefault("TQDM_DISABLE", "1")  # any other tqdm bar


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    transport = parser.add_mutually_exclusive_group()
    transport.add_argument(
        "--stdio", action="store_true", help="talk LSP over stdin/stdout (the default)"
    )
    transport.add_argument("--tcp", action="store_true", help="listen for one client over TCP")
    parser.add_argument("--host", default="127.0.0.1", help="TCP host (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=2087, help="TCP port (default 2087)")
    parser.add_argument("--log-file", help="also write the log to this file")
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="stderr gets warnings and errors; -v info too; -vv debug (the log too)",
    )
    parser.add_argument("--version", action="version", version=f"tabloop {__version__}")


def serve(args: argparse.Namespace) -> int:
    level = configure_logging(args.verbose, args.log_file)
    quiet_progress_bars()
    from lsp_server.features import create_server
    from lsp_server.logging_bridge import attach_client_logging

    server = create_server()
    attach_client_logging(server, level)
    if args.tcp:
        log.info("tabloop %s listening on %s:%d", __version__, args.host, args.port)
        server.start_tcp(args.host, args.port)
    else:
        # Benchmarks wait for this line to time `initialize` apart from Python's start-up.
        log.info("%s %s on stdio", LISTENING_MESSAGE, __version__)
        server.start_io()
    return 0
