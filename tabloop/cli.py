"""The `tabloop` command line.

`serve` runs the language server; everything else is for people: debugging one completion,
diagnosing a setup, indexing, the backend, benchmarks and evaluations. Under `serve`, stdout
carries JSON-RPC only, the log goes to the client (`window/logMessage`) and `--log-file`, and
stderr gets warnings and errors (`lsp_server.main`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from lsp_server import __version__
from lsp_server.main import add_serve_arguments, serve

# Each subcommand's module is imported when the command runs (so `tabloop --version` does not
# load torch), by a plain import statement that readers and type checkers follow.
Command = Callable[[list[str]], int]


def _index(argv: list[str]) -> int:
    from indexer.cli import index_main

    return index_main(argv)


def _search(argv: list[str]) -> int:
    from indexer.cli import search_main

    return search_main(argv)


def _backend(argv: list[str]) -> int:
    from backend.cli import backend_main

    return backend_main(argv)


def _train(argv: list[str]) -> int:
    """`train policy` (also plain `train`, as before), `train model`, `train edits` or
    `train edit-screen`."""
    if argv[:1] == ["model"]:
        from tabloop.model_cli import train_model_main

        return train_model_main(argv[1:])
    if argv[:1] == ["edits"]:
        from tabloop.edits_cli import train_edits_main

        return train_edits_main(argv[1:])
    if argv[:1] == ["edit-screen"]:
        from tabloop.edits_cli import train_screen_main

        return train_screen_main(argv[1:])
    from backend.policy_cli import train_main

    return train_main(argv[1:] if argv[:1] == ["policy"] else argv)


def _model(argv: list[str]) -> int:
    from tabloop.model_cli import model_main

    return model_main(argv)


def _policy(argv: list[str]) -> int:
    from backend.policy_cli import policy_main

    return policy_main(argv)


def _stats(argv: list[str]) -> int:
    from backend.stats_cli import stats_main

    return stats_main(argv)


# Commands implemented next to the code they drive, which parse their own arguments:
# name -> (function taking the remaining arguments and returning an exit status, help).
DELEGATED: dict[str, tuple[Command, str]] = {
    "index": (_index, "index a workspace"),
    "search": (_search, "search a workspace index by meaning"),
    "backend": (_backend, "run the training backend, manage tokens"),
    "train": (_train, "train policy (the default), model (an adapter) or edits (next edits)"),
    "model": (_model, "list, promote, roll back or evaluate model adapters"),
    "policy": (_policy, "list, promote, approve or roll back policies"),
    "stats": (_stats, "the loop's figures of a tenant (the dashboard's overview)"),
}


def _eval_holes(argv: list[str]) -> int:
    from evaluation.holes import main

    return main(argv)


def _eval_replay(argv: list[str]) -> int:
    from evaluation.replay import main

    return main(argv)


def _eval_edits(argv: list[str]) -> int:
    from evaluation.edits.command import main

    return main(argv)


def _eval_adapter(argv: list[str]) -> int:
    from evaluation.adapter_files import main

    return main(argv)


def _eval_edit_screen(argv: list[str]) -> int:
    from tabloop.edits_cli import eval_screen_main

    return eval_screen_main(argv)


EVALUATIONS: dict[str, Command] = {
    "holes": _eval_holes,
    "adapter": _eval_adapter,
    "replay": _eval_replay,
    "edits": _eval_edits,
    "edit-screen": _eval_edit_screen,
}


@dataclass(frozen=True)
class Benchmark:
    """One `tabloop bench NAME` (evaluation/bench/NAME.py): its `main`, imported when it runs."""

    load: Callable[[], Command]
    make: bool = False
    """`make bench` runs it with its defaults (minutes on a CPU)."""


def _bench_lsp() -> Command:
    from evaluation.bench import lsp

    return lsp.main


def _bench_complete() -> Command:
    from evaluation.bench import complete

    return complete.main


def _bench_engines() -> Command:
    from evaluation.bench import engines

    return engines.main


def _bench_reuse() -> Command:
    from evaluation.bench import reuse

    return reuse.main


def _bench_index() -> Command:
    from evaluation.bench import index

    return index.main


def _bench_telemetry() -> Command:
    from evaluation.bench import telemetry

    return telemetry.main


def _bench_sync() -> Command:
    from evaluation.bench import sync

    return sync.main


def _bench_dtype() -> Command:
    from evaluation.bench import dtype

    return dtype.main


def _bench_threads() -> Command:
    from evaluation.bench import threads

    return threads.main


def _bench_gate() -> Command:
    from evaluation.bench import gate

    return gate.main


def _bench_edits() -> Command:
    from evaluation.bench import edits

    return edits.main


def _bench_speculative() -> Command:
    from evaluation.bench import speculative

    return speculative.main


def _bench_speculative_edits() -> Command:
    from evaluation.bench import speculative_edits

    return speculative_edits.main


def _bench_next_edit_chain() -> Command:
    from evaluation.bench import next_edit_chain

    return next_edit_chain.main


def _bench_adapters() -> Command:
    from evaluation.bench import adapters

    return adapters.main


def _bench_objectives() -> Command:
    from evaluation.bench import objectives

    return objectives.main


def _bench_embedding() -> Command:
    from evaluation.bench import embedding

    return embedding.main


def _bench_dashboard() -> Command:
    from evaluation.bench import dashboard

    return dashboard.main


def _bench_scale() -> Command:
    from evaluation.bench import scale

    return scale.main


def _bench_syntax() -> Command:
    from evaluation.bench import syntax

    return syntax.main


def _bench_train() -> Command:
    from evaluation.bench import train

    return train.main


# The one list of benchmarks: `tabloop bench`, its help and `make bench` read it.
BENCHMARKS: dict[str, Benchmark] = {
    "lsp": Benchmark(_bench_lsp, make=True),
    "complete": Benchmark(_bench_complete, make=True),
    "engines": Benchmark(_bench_engines, make=True),
    "reuse": Benchmark(_bench_reuse),
    "index": Benchmark(_bench_index, make=True),
    "telemetry": Benchmark(_bench_telemetry, make=True),
    "sync": Benchmark(_bench_sync, make=True),
    "dtype": Benchmark(_bench_dtype, make=True),
    "threads": Benchmark(_bench_threads),
    "gate": Benchmark(_bench_gate),
    "edits": Benchmark(_bench_edits),
    "speculative": Benchmark(_bench_speculative),
    "speculative-edits": Benchmark(_bench_speculative_edits),
    "next-edit-chain": Benchmark(_bench_next_edit_chain),
    "adapters": Benchmark(_bench_adapters),
    "objectives": Benchmark(_bench_objectives),
    "embedding": Benchmark(_bench_embedding),
    "dashboard": Benchmark(_bench_dashboard),
    "scale": Benchmark(_bench_scale),
    "syntax": Benchmark(_bench_syntax),
    "train": Benchmark(_bench_train),
}


def _bench(name: str) -> Command:
    """The `main` of benchmark `name`."""
    if name not in BENCHMARKS:
        raise SystemExit(
            f"tabloop bench: unknown benchmark {name!r}; choose one of {', '.join(BENCHMARKS)}"
        )
    return BENCHMARKS[name].load()


def complete(args: argparse.Namespace) -> int:
    from lsp_server.oneshot import complete_at

    return complete_at(args.location, as_json=args.json, workspace=args.workspace)


def doctor(args: argparse.Namespace) -> int:
    from lsp_server.doctor import run_doctor

    return run_doctor(Path(args.workspace) if args.workspace else Path.cwd(), as_json=args.json)


def demo(args: argparse.Namespace) -> int:
    from evaluation.demo import run_demo

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
    if args.list is not None:  # the names, one a line (`make bench` reads the `make` ones)
        print("\n".join(n for n, b in BENCHMARKS.items() if args.list == "all" or b.make))
        return 0
    if args.name is None:
        raise SystemExit(f"tabloop bench: name a benchmark: {', '.join(BENCHMARKS)}")
    return _bench(args.name)(list(args.rest))


def evaluate(args: argparse.Namespace) -> int:
    return EVALUATIONS[args.kind](list(args.rest))


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
    p.add_argument("name", nargs="?", help=", ".join(BENCHMARKS))
    p.add_argument(
        "--list",
        nargs="?",
        const="all",
        choices=("all", "make"),
        help="print the benchmarks' names (make: those `make bench` runs)",
    )
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=bench)

    p = sub.add_parser("eval", help="evaluations: holes, replay, edits", add_help=False)
    p.add_argument("kind", choices=sorted(EVALUATIONS))
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=evaluate)

    for name, (_command, help_text) in DELEGATED.items():
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
        return int(DELEGATED[argv[0]][0](argv[1:]) or 0)
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
