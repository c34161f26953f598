"""`tabloop backend`: run the training backend, and manage tenant tokens.

tabloop backend [--host 127.0.0.1] [--port 8765] [--db URL]
tabloop backend token create --tenant NAME [--db URL]
tabloop backend token revoke TOKEN [--db URL]
"""

from __future__ import annotations

import argparse
import logging
import sys

from backend.storage import Storage, default_db_url

DEFAULT_PORT = 8765


def _db_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        default=None,
        help=f"SQLAlchemy database URL (default: {default_db_url()}); "
        "postgresql+psycopg://user:pass@host/db for PostgreSQL",
    )


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tabloop backend",
        description="Run the training backend (migrates the database on start). "
        "`tabloop backend token ...` manages tenant tokens.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on")
    _db_argument(parser)
    parser.add_argument("--rate", type=float, default=None, help="events/s per tenant")
    parser.add_argument("-v", "--verbose", action="store_true", help="log requests")
    parser.add_argument(
        "--completion-model",
        default=None,
        help="model served at /v1/completions: `bundled` (default), a hub id or a local path",
    )
    parser.add_argument(
        "--preload-model", action="store_true", help="load the completion model at start"
    )
    return parser


def _token_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tabloop backend token", description="tenant tokens")
    sub = parser.add_subparsers(dest="action", required=True)
    create = sub.add_parser("create", help="make a token for a tenant (created if new)")
    create.add_argument("--tenant", required=True, help="tenant name")
    _db_argument(create)
    revoke = sub.add_parser("revoke", help="make a token unusable")
    revoke.add_argument("token")
    _db_argument(revoke)
    return parser


def _tokens(argv: list[str]) -> int:
    args = _token_parser().parse_args(argv)
    storage = Storage(args.db or default_db_url())
    try:
        if args.action == "create":
            try:
                print(storage.create_token(args.tenant))
            except ValueError as exc:
                print(f"tabloop backend: {exc}", file=sys.stderr)
                return 2
            return 0
        if storage.revoke_token(args.token):
            print("revoked")
            return 0
        print("tabloop backend: unknown or already revoked token", file=sys.stderr)
        return 1
    finally:
        storage.close()


def _serve(argv: list[str]) -> int:
    import uvicorn

    from backend.app import create_app
    from backend.routes.events import IngestLimits
    from backend.routes.policy import schedule_training

    args = _serve_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    limits = IngestLimits() if args.rate is None else IngestLimits(rate_events_per_s=args.rate)
    db_url = args.db or default_db_url()
    app = create_app(db_url, limits=limits)
    schedule_training(app)  # the learning loop: train and promote policies while serving
    from backend.routes import completions
    from completion.settings import CompletionSettings

    served = CompletionSettings(model=args.completion_model or "bundled")
    completions.configure(app, served, preload=args.preload_model)
    print(
        f"tabloop backend on http://{args.host}:{args.port} (database {db_url.split('@')[-1]})",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="info" if args.verbose else "warning",
        access_log=args.verbose,
    )
    return 0


def backend_main(argv: list[str]) -> int:
    """Entry point of `tabloop backend ...`."""
    if argv[:1] == ["token"]:
        return _tokens(argv[1:])
    return _serve(argv)


if __name__ == "__main__":
    sys.exit(backend_main(sys.argv[1:]))
