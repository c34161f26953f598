"""Starting the language server: logging, transport arguments, and `serve`.

Shared by `python -m lsp_server` and `tabloop serve`. Under `serve`, stdout carries JSON-RPC only;
logs go to stderr or `--log-file`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from lsp_server import __version__

log = logging.getLogger(__name__)

LISTENING_MESSAGE = "tabloop language server listening"


def configure_logging(verbosity: int, log_file: str | None = None) -> None:
    """Logs to stderr (never stdout, which may carry JSON-RPC) or to a file."""
    level = logging.WARNING - 10 * min(verbosity, 2)
    handler: logging.Handler = (
        logging.FileHandler(log_file, encoding="utf-8")
        if log_file
        else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # pygls logs every message it sends at INFO; keep that for -vv.
    logging.getLogger("pygls").setLevel(level if verbosity >= 2 else logging.WARNING)


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    transport = parser.add_mutually_exclusive_group()
    transport.add_argument(
        "--stdio", action="store_true", help="talk LSP over stdin/stdout (the default)"
    )
    transport.add_argument("--tcp", action="store_true", help="listen for one client over TCP")
    parser.add_argument("--host", default="127.0.0.1", help="TCP host (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=2087, help="TCP port (default 2087)")
    parser.add_argument("--log-file", help="write logs to this file instead of stderr")
    parser.add_argument(
        "-v", "--verbose", action="count", default=1, help="-v info (default), -vv debug"
    )
    parser.add_argument("--version", action="version", version=f"tabloop {__version__}")


def serve(args: argparse.Namespace) -> int:
    configure_logging(args.verbose, args.log_file)
    from lsp_server.features import create_server
    from lsp_server.logging_bridge import attach_client_logging

    server = create_server()
    attach_client_logging(server)
    if args.tcp:
        log.info("tabloop %s listening on %s:%d", __version__, args.host, args.port)
        server.start_tcp(args.host, args.port)
    else:
        # Benchmarks wait for this line to time `initialize` apart from Python's start-up.
        log.info("%s %s on stdio", LISTENING_MESSAGE, __version__)
        server.start_io()
    return 0
