"""`tabloop backend`: run the training backend, and manage tenant tokens.

tabloop backend [--host 127.0.0.1] [--port 8765] [--db URL] [--workers N] [--lambda 1]
                [--train-interval 60] [--failover 30] [--rate-limits shared|local]
                [--adapter-every 1h|off] [--adapter-min-events 200] [--adapter-budget 20m]
                [--adapter-model bundled] [--adapter-blob-url URL]
tabloop backend trainer --db POSTGRESQL_URL [--failover 30] [--lambda 1]
                        [--adapters [--adapter-budget 20m] [--adapter-model bundled]
                                    [--adapter-blob-url URL]]
tabloop backend token create --tenant NAME [--label WHO] [--admin] [--db URL]
tabloop backend token revoke TOKEN [--db URL]
tabloop backend tenant set NAME --require-approval|--no-require-approval [--db URL]

The serving and trainer commands build the backend's settings once (`backend.settings.
BackendSettings`): the defaults, then `TABLOOP_BACKEND_*` variables, then the flags given here.
"""

from __future__ import annotations

import argparse
import fcntl
import gc
import json
import logging
import os
import sys
import tempfile
from typing import IO, TYPE_CHECKING, Any

from pydantic import ValidationError

from backend.settings import DEFAULT_FAILOVER_S, DEFAULT_PORT
from backend.storage import PG_INGEST_PATHS, Storage, default_db_url

if TYPE_CHECKING:
    from backend.adapters.scheduler import AdapterSchedule
    from backend.app import BackendApp
    from backend.policy.settings import TrainerSettings
    from backend.settings import BackendSettings
# How `_serve` hands its options to worker processes, which uvicorn starts by import string.
WORKER_ENV = "TABLOOP_BACKEND_WORKER_ARGS"
TRAINING_LOCK_ENV = "TABLOOP_BACKEND_TRAINING_LOCK"


def _db_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        default=None,
        help=f"SQLAlchemy database URL (default: {default_db_url()}); "
        "postgresql+psycopg://user:pass@host/db for PostgreSQL",
    )


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number >= 0")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number > 0")
    return value


def _serve_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tabloop backend",
        description="Run the training backend (migrates the database on start). "
        "`tabloop backend token ...` manages tenant tokens.",
    )
    parser.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=None, help=f"port to listen on (default {DEFAULT_PORT})"
    )
    _db_argument(parser)
    parser.add_argument("--rate", type=float, default=None, help="events/s per tenant")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes sharing the port (default 1; rate limits, metrics and caches "
        "are per worker)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", default=None, help="log requests")
    parser.add_argument(
        "--lambda",
        dest="distraction_cost",
        type=_non_negative,
        default=None,
        help="trainer: an ignored suggestion costs lambda characters (default 1)",
    )
    parser.add_argument(
        "--train-interval",
        type=_positive,
        default=None,
        help="trainer: seconds between training runs (default 60)",
    )
    parser.add_argument(
        "--completion-model",
        default=None,
        help="model served at /v1/completions: `bundled` (default), a hub id or a local path",
    )
    parser.add_argument(
        "--preload-model",
        action="store_true",
        default=None,
        help="load the completion model at start",
    )
    parser.add_argument(
        "--failover",
        type=_positive,
        default=None,
        help="PostgreSQL: seconds within which another instance takes the trainer over after "
        "the elected one dies (default 30)",
    )
    parser.add_argument(
        "--rate-limits",
        choices=("shared", "local"),
        default=None,
        help="shared: per-tenant limits held in PostgreSQL across instances (the default on "
        "PostgreSQL); local: per process (always on SQLite)",
    )
    parser.add_argument(
        "--pg-ingest",
        choices=PG_INGEST_PATHS,
        default=None,
        help="how events are inserted into PostgreSQL: array (one JSON array per batch, the "
        "default) or rows (multi-row VALUES, the earlier path; a benchmark baseline)",
    )
    _adapter_arguments(parser)
    parser.add_argument(
        "--metrics-tenant-labels",
        action="store_true",
        default=None,
        help="label /metrics counters with tenant names (off: /metrics is served without a token)",
    )
    return parser


def _duration(text: str) -> float:
    from training.budget import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _period_or_off(text: str) -> float:
    """A period (`_duration`), or 0 for `off` or `0`: the schedule turned off."""
    from backend.adapters.scheduler import OFF

    if text.strip().lower() in OFF or text.strip() in ("0", "0s"):
        return 0.0
    return _duration(text)


def _adapter_arguments(parser: argparse.ArgumentParser, *, trainer: bool = False) -> None:
    if trainer:
        group = parser.add_argument_group(
            "adapters", "also claim the tenants' adapter training jobs (off unless --adapters)"
        )
        group.add_argument(
            "--adapters",
            action="store_true",
            help="claim and run adapter jobs too (this machine trains the model: a GPU node)",
        )
        parser.set_defaults(adapter_every=None)
    else:
        group = parser.add_argument_group(
            "adapters",
            "training the tenants' model adapters from text-carrying events (on by "
            "default; --adapter-every off turns it off)",
        )
        group.add_argument(
            "--adapter-every",
            type=_period_or_off,
            default=None,
            help="period of adapter training passes, e.g. 6h; off or 0 trains none (default "
            "1h; a tenant without enough new text-carrying events costs one count a pass)",
        )
    group.add_argument(
        "--adapter-min-events",
        type=int,
        default=None,
        help="new shown, text-carrying decisions that make a tenant due (default 200)",
    )
    group.add_argument(
        "--adapter-budget",
        type=_duration,
        default=None,
        help="wall-clock budget of one adapter run (default 20m)",
    )
    group.add_argument(
        "--adapter-samples",
        type=int,
        default=None,
        help="also end an adapter run after this many training examples",
    )
    group.add_argument(
        "--adapter-model", default=None, help="base model of the adapters (default: bundled)"
    )
    group.add_argument(
        "--adapter-blob-url",
        default=None,
        help="where the adapter files are stored: a directory or any fsspec URL, the same for "
        "every instance and trainer (default: adapter-blobs/ in the cache directory)",
    )


def adapter_schedule(args: argparse.Namespace) -> AdapterSchedule:
    """The adapter schedule the command line sets (on unless --adapter-every off)."""
    return backend_settings(args).adapters


def _token_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tabloop backend token", description="tenant tokens")
    sub = parser.add_subparsers(dest="action", required=True)
    create = sub.add_parser("create", help="make a token for a tenant (created if new)")
    create.add_argument("--tenant", required=True, help="tenant name")
    create.add_argument(
        "--label", default=None, help="who holds the token; the history records it as who acted"
    )
    create.add_argument(
        "--admin",
        action="store_true",
        help="the token also reads every tenant's statistics and acts on every registry",
    )
    _db_argument(create)
    revoke = sub.add_parser("revoke", help="make a token unusable")
    revoke.add_argument("token")
    _db_argument(revoke)
    return parser


def _tenant_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tabloop backend tenant", description="tenant settings")
    sub = parser.add_subparsers(dest="action", required=True)
    change = sub.add_parser("set", help="change a tenant's settings (the tenant is created if new)")
    change.add_argument("tenant", help="tenant name")
    change.add_argument(
        "--require-approval",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="candidates that pass evaluation wait for `tabloop policy approve` before serving",
    )
    _db_argument(change)
    return parser


def _tenants(argv: list[str]) -> int:
    args = _tenant_parser().parse_args(argv)
    if args.require_approval is None:
        print("tabloop backend tenant set: nothing to set (--require-approval?)", file=sys.stderr)
        return 2
    storage = Storage(args.db or default_db_url())
    try:
        storage.set_require_approval(args.tenant, args.require_approval)
    except ValueError as exc:
        print(f"tabloop backend: {exc}", file=sys.stderr)
        return 2
    finally:
        storage.close()
    state = "required" if args.require_approval else "not required"
    print(f"{args.tenant}: approval {state}")
    return 0


def _tokens(argv: list[str]) -> int:
    args = _token_parser().parse_args(argv)
    storage = Storage(args.db or default_db_url())
    try:
        if args.action == "create":
            try:
                print(storage.create_token(args.tenant, label=args.label, admin=args.admin))
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


def trainer_settings(args: argparse.Namespace) -> TrainerSettings:
    """The scheduled trainer's settings: the defaults, with what the command line sets."""
    return backend_settings(args).trainer


# Flag (argparse dest) -> where it goes in `BackendSettings`.
_FLAGS: dict[str, tuple[str, ...]] = {
    "db": ("db_url",),
    "host": ("host",),
    "port": ("port",),
    "workers": ("workers",),
    "verbose": ("log_requests",),
    "rate": ("limits", "rate_events_per_s"),
    "distraction_cost": ("trainer", "rewards", "distraction_cost"),
    "train_interval": ("trainer", "interval_s"),
    "completion_model": ("completion", "model"),
    "preload_model": ("preload_model",),
    "failover": ("failover_s",),
    "pg_ingest": ("pg_ingest",),
    "metrics_tenant_labels": ("metrics_tenant_labels",),
    "adapter_every": ("adapters", "every_s"),
    "adapter_min_events": ("adapters", "min_new_events"),
    "adapter_budget": ("adapters", "budget_s"),
    "adapter_samples": ("adapters", "budget_samples"),
    "adapter_model": ("adapters", "model"),
    "adapter_blob_url": ("adapters", "blob_url"),
}


def backend_settings(args: argparse.Namespace) -> BackendSettings:
    """The backend's settings: the defaults, then `TABLOOP_BACKEND_*`, then the flags given
    (a flag left out keeps what the environment says)."""
    from backend.settings import BackendSettings

    flags: dict[str, Any] = {}
    for dest, path in _FLAGS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        node = flags
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    rate_limits = getattr(args, "rate_limits", None)
    if rate_limits is not None:
        flags["shared_rate_limits"] = rate_limits == "shared"
    try:
        return BackendSettings(**flags)
    except ValidationError as exc:
        raise SystemExit(f"tabloop backend: {exc}") from None


def serving_settings(args: argparse.Namespace, *, migrate: bool, train: bool) -> BackendSettings:
    """The settings of a serving process: `backend_settings`, with the choices `tabloop backend`
    makes for the database it is given."""
    settings = backend_settings(args)
    postgres = settings.postgres
    if settings.shared_rate_limits and not postgres:
        raise SystemExit("tabloop backend: --rate-limits shared needs PostgreSQL")
    return settings.model_copy(
        update={
            "migrate": migrate,
            "train": train,
            # On PostgreSQL the trainer is elected in the database among every instance (and
            # every worker); on SQLite one process trains, chosen by the file lock.
            "failover_s": (settings.failover_s or DEFAULT_FAILOVER_S) if postgres else None,
            # On PostgreSQL rate limits are shared across instances unless `--rate-limits local`.
            "shared_rate_limits": postgres and settings.shared_rate_limits is not False,
        }
    )


def _build_app(args: argparse.Namespace, *, migrate: bool, train: bool) -> BackendApp:
    from backend.app import create_app

    # Every worker gets the same settings, so the built-in policy each serves until a version is
    # promoted is the same; only the worker that `train`s runs the trainer. Model weights live
    # where every other command keeps them (`BackendSettings.cache_dir`).
    return create_app(serving_settings(args, migrate=migrate, train=train))


def _is_postgres(url: str) -> bool:
    from sqlalchemy.engine import make_url

    return make_url(url).get_backend_name() == "postgresql"


def _claim_training(path: str) -> IO[bytes] | None:
    """The open lock file when this worker is the one that trains (first to lock it), else None.

    The lock lasts as long as the process: if the training worker dies, the one uvicorn starts
    in its place takes over.
    """
    handle = open(path, "ab")  # noqa: SIM115 - kept open for the life of the process
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


# Container objects allocated (net) between two collections of the youngest generation; Python's
# default is 700.
GC_YOUNG_THRESHOLD = 10_000


def tune_gc_for_serving() -> None:
    """Keep the garbage collector to what requests leave behind.

    Every object made at start-up (modules, the app, its schemas: about 270,000) is frozen out
    of the collector's reach: they live as long as the process, and full collections walked
    them about once a second under full ingest, a fifth of the instance's CPU (`perf`). The
    youngest generation is collected every 10,000 allocations instead of 700: a batch's events
    (a few thousand objects) were caught in flight by every collection and walked again in
    each older generation, though nearly all die with their request; that was another 8%
    (`perf`), and is 0.2% now. What waits for a collection is only cyclic garbage.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)


def worker_app() -> BackendApp:
    """The app of one worker process under `--workers N` (uvicorn's factory)."""
    args = _serve_parser().parse_args(json.loads(os.environ[WORKER_ENV]))
    if backend_settings(args).postgres:
        # Every worker stands in the election; the database picks one.
        app = _build_app(args, migrate=False, train=True)
    else:
        lock = _claim_training(os.environ[TRAINING_LOCK_ENV])
        # The parent migrated the database before starting the workers.
        app = _build_app(args, migrate=False, train=lock is not None)
        app.services.training_lock = lock
    tune_gc_for_serving()
    return app


def _serve(argv: list[str]) -> int:
    import uvicorn

    from backend.connections import server_options

    args = _serve_parser().parse_args(argv)
    if args.workers is not None and args.workers < 1:
        print("tabloop backend: --workers must be at least 1", file=sys.stderr)
        return 2
    settings = backend_settings(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    print(
        f"tabloop backend on http://{settings.host}:{settings.port} (database "
        f"{settings.db_url.split('@')[-1]}, {settings.workers} "
        f"worker{'s' if settings.workers > 1 else ''})",
        file=sys.stderr,
        flush=True,
    )
    log_level = "info" if settings.log_requests else "warning"
    if settings.workers == 1:
        app = _build_app(args, migrate=True, train=True)
        tune_gc_for_serving()
        uvicorn.run(
            app,
            host=settings.host,
            port=settings.port,
            log_level=log_level,
            access_log=settings.log_requests,
            **server_options(),
        )
        return 0
    Storage(settings.db_url).close()  # migrate once, here, before any worker opens the database
    with tempfile.TemporaryDirectory(prefix="tabloop-backend-") as tmp:
        os.environ[WORKER_ENV] = json.dumps(argv)
        os.environ[TRAINING_LOCK_ENV] = os.path.join(tmp, "training.lock")
        uvicorn.run(
            "backend.cli:worker_app",
            factory=True,
            workers=settings.workers,
            host=settings.host,
            port=settings.port,
            log_level=log_level,
            access_log=settings.log_requests,
            **server_options(),
        )
    return 0


def _trainer_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tabloop backend trainer",
        description="Train tenants' policies from the jobs in a shared PostgreSQL database (on "
        "another machine than the backend instances, for example); runs until stopped.",
    )
    _db_argument(parser)
    parser.add_argument(
        "--failover",
        type=_positive,
        default=None,
        help="seconds after which a job of a trainer that died is claimed again (default 30)",
    )
    parser.add_argument(
        "--lambda",
        dest="distraction_cost",
        type=_non_negative,
        default=None,
        help="an ignored suggestion costs lambda characters (default 1)",
    )
    _adapter_arguments(parser, trainer=True)
    parser.set_defaults(train_interval=None)
    return parser


def _trainer(argv: list[str]) -> int:
    import signal
    import threading

    from backend.scheduler import ClusterTrainer

    args = _trainer_parser().parse_args(argv)
    settings = backend_settings(args)
    if not settings.postgres:
        print("tabloop backend trainer: needs a PostgreSQL --db", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    storage = Storage(settings.db_url)
    trainer = ClusterTrainer(
        storage,
        settings.trainer,
        failover_s=settings.failover_s or DEFAULT_FAILOVER_S,
        elect=False,
        adapters=settings.adapters if args.adapters else None,
        cache_dir=settings.cache_dir,
    )
    stopped = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stopped.set())
    print(f"tabloop backend trainer {trainer.holder}", file=sys.stderr, flush=True)
    trainer.start()
    stopped.wait()
    ended = trainer.stop()
    if ended:
        storage.close()
    return 0


def backend_main(argv: list[str]) -> int:
    """Entry point of `tabloop backend ...`."""
    if argv[:1] == ["trainer"]:
        return _trainer(argv[1:])
    if argv[:1] == ["token"]:
        return _tokens(argv[1:])
    if argv[:1] == ["tenant"]:
        return _tenants(argv[1:])
    return _serve(argv)


if __name__ == "__main__":
    sys.exit(backend_main(sys.argv[1:]))
