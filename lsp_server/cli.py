"""The `tabloop` command line.

`serve` runs the language server; everything else is for people: debugging one completion,
diagnosing a setup, indexing, the backend, benchmarks and evaluations. Under `serve`, stdout
carries JSON-RPC only; logs go to stderr or `--log-file`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from lsp_server import __version__

log = logging.getLogger(__name__)

LISTENING_MESSAGE = "tabloop language server listening"

# Commands implemented next to the code they drive: name -> ("module:function", help).
# Each function takes the remaining arguments and returns an exit status.
DELEGATED: dict[str, tuple[str, str]] = {
    "index": ("indexer.cli:index_main", "index a workspace"),
    "search": ("indexer.cli:search_main", "search a workspace index by meaning"),
    "backend": ("backend.cli:backend_main", "run the training backend, manage tokens"),
    "train": ("backend.policy_cli:train_main", "train a candidate policy from events"),
    "policy": ("backend.policy_cli:policy_main", "list, promote or roll back policies"),
}
EVALUATIONS: dict[str, str] = {
    "holes": "lsp_server.evaluation:main",
    "replay": "backend.replay:main",
}


def _load(target: str) -> Callable[[list[str]], int]:
    module_name, _, function = target.partition(":")
    function_obj: Callable[[list[str]], int] = getattr(
        importlib.import_module(module_name), function
    )
    return function_obj


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
    from lsp_server.logging_bridge import attach_client_logging
    from lsp_server.server import create_server

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


def complete(args: argparse.Namespace) -> int:
    from lsp_server.oneshot import complete_at

    return complete_at(args.location, as_json=args.json, workspace=args.workspace)


def doctor(args: argparse.Namespace) -> int:
    from lsp_server.doctor import run_doctor

    return run_doctor(Path(args.workspace) if args.workspace else Path.cwd(), as_json=args.json)


def demo(args: argparse.Namespace) -> int:
    from lsp_server.demo import run_demo

    return run_demo(args)


def show_config(args: argparse.Namespace) -> int:
    from lsp_server import config

    if args.update_readme:
        changed = config.update_readme(Path(args.update_readme))
        print(f"{args.update_readme}: {'updated' if changed else 'already current'}")
        return 0
    if args.markdown:
        sys.stdout.write(config.markdown_table())
        return 0
    resolved = config.resolve(Path(args.workspace) if args.workspace else Path.cwd())
    print(json.dumps(resolved.settings.model_dump(by_alias=True), indent=2))
    for problem in resolved.problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 0


def bench(args: argparse.Namespace) -> int:
    module = importlib.import_module(f"bench.{args.name.replace('-', '_')}")
    status: int = module.main(list(args.rest))
    return status


def evaluate(args: argparse.Namespace) -> int:
    return _load(EVALUATIONS[args.kind])(list(args.rest))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tabloop", description="AI code completion over LSP that learns when to speak."
    )
    parser.add_argument("--version", action="version", version=f"tabloop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("serve", help="run the language server (stdio by default)")
    add_serve_arguments(p)
    p.set_defaults(func=serve)

    p = sub.add_parser("complete", help="one completion through the engine, for debugging")
    p.add_argument("location", help="FILE:LINE:COL, 1-based")
    p.add_argument("--workspace", help="workspace root for configuration (default: cwd)")
    p.add_argument("--json", action="store_true", help="print the decision as JSON")
    p.set_defaults(func=complete)

    p = sub.add_parser("doctor", help="configuration, models, versions and problems")
    p.add_argument("--workspace", help="workspace root (default: cwd)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=doctor)

    p = sub.add_parser("demo", help="see tabloop work end to end on real code")
    p.add_argument("--model", default=None, help="completion model (default: configured)")
    p.add_argument("--files", type=int, default=3, help="files to complete in")
    p.add_argument("--positions", type=int, default=2, help="positions per file")
    p.set_defaults(func=demo)

    p = sub.add_parser("config", help="print the resolved configuration")
    p.add_argument("--workspace", help="workspace root (default: cwd)")
    p.add_argument("--markdown", action="store_true", help="the README's configuration table")
    p.add_argument("--update-readme", metavar="README", help="rewrite the table in this file")
    p.set_defaults(func=show_config)

    p = sub.add_parser("bench", help="benchmarks; each prints JSON", add_help=False)
    p.add_argument("name", help="lsp, complete, index, telemetry, sync, dtype, threads, gate")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=bench)

    p = sub.add_parser("eval", help="evaluations: holes, replay", add_help=False)
    p.add_argument("kind", choices=sorted(EVALUATIONS))
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=evaluate)

    for name, (_target, help_text) in DELEGATED.items():
        # Listed for `--help`; `main` hands their arguments over before argparse sees them.
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tabloop` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if not argv:
        parser.print_help()
        return 2
    if argv[0] in DELEGATED:  # argparse's REMAINDER drops a leading option: pass argv through
        return int(_load(DELEGATED[argv[0]][0])(argv[1:]) or 0)
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
