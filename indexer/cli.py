"""`tabloop index` and `tabloop search`, and the indexing step of the demo.

Both read the configuration the way the server does (`common.config`): the `index` section and
`cacheDir` from the user's `config.toml`, the workspace's `tabloop.toml` (or `[tool.tabloop]`
in `pyproject.toml`) and `TABLOOP_*` variables, for the workspace they act on; flags override.
So the command and the server build the same index in the same place. With no `cacheDir`
anywhere, the index lives in `$TABLOOP_CACHE_DIR`, else the platform's cache directory.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from common import config
from indexer.pipeline import IndexStats
from indexer.progress import LOAD, StageProgress
from indexer.service import WorkspaceIndex, index_workspace
from indexer.settings import IndexCommandSettings, IndexSettings
from indexer.types import SearchHit

Progress = Callable[[str, int, int], None]


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cache-dir", type=Path, help="where indexes live (default: the configured cacheDir)"
    )
    parser.add_argument(
        "--model",
        default=None,
        help="embedding model: `bundled`, a name or a local path (default: index.embeddingModel)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv debug)")


def resolve_settings(
    root: Path, args: argparse.Namespace, *, environ: Mapping[str, str] | None = None
) -> config.Resolved[IndexCommandSettings]:
    """The command's settings for workspace `root`: every file and environment layer, then the
    flags the user gave."""
    flags: dict[str, Any] = {}
    if args.cache_dir:
        flags["cache_dir"] = str(args.cache_dir)
    if args.model:
        flags["index"] = {"embedding_model": args.model}
    endpoint = {
        key: value
        for key, value in (
            ("url", getattr(args, "backend_url", None)),
            ("token", getattr(args, "token", None)),
        )
        if value
    }
    if endpoint:
        flags["backend"] = endpoint
    return config.resolve(
        IndexCommandSettings,
        root,
        above=[config.flag_layer(flags)],
        environ=environ,
        # The server's other sections are the server's to check.
        ignore_other_keys=True,
    )


def _logging(verbose: int) -> None:
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )


def run_index(
    root: Path,
    settings: IndexSettings,
    cache_dir: Path,
    progress: Progress | None = None,
) -> tuple[WorkspaceIndex, IndexStats]:
    """Index `root` in the foreground; raises RuntimeError when indexing failed."""
    index, stats = index_workspace(root, settings, cache_dir, progress)
    status = index.status()
    if status["state"] == "failed" or (stats is None and status["state"] != "readonly"):
        index.close()
        raise RuntimeError(status["error"] or "indexing failed")
    return index, stats or IndexStats()


def run_index_with_sync(
    root: Path,
    settings: IndexCommandSettings,
    cache_dir: Path,
    progress: Progress | None = None,
) -> tuple[WorkspaceIndex, IndexStats, dict[str, Any]]:
    """`tabloop index --sync`: prefetch the team's vectors when there is no local index yet,
    index, then sync. Raises RuntimeError with a message for the terminal; the caller closes
    the returned index."""
    from indexer.sync_setup import prefetch_for_new_index, push_index, sync_client, sync_keys

    client = sync_client(settings.backend)  # refuses before anything is written
    try:
        keys = sync_keys(cache_dir, settings.index.sync_secret)
        figures = prefetch_for_new_index(root, settings.index, cache_dir, keys, client)
        index, stats = run_index(root, settings.index, cache_dir, progress)
        try:
            figures.update(push_index(index, keys, client))
        except RuntimeError:
            index.close()
            raise
        return index, stats, figures
    finally:
        client.close()


def _report_problems(command: str, resolved: config.Resolved[IndexCommandSettings]) -> None:
    for problem in resolved.problems:
        print(f"{command}: configuration: {problem}", file=sys.stderr)


def index_main(argv: list[str]) -> int:
    """`tabloop index [PATH]`: bring the index of PATH up to date."""
    parser = argparse.ArgumentParser(
        prog="tabloop index", description="Index a workspace for search by meaning."
    )
    parser.add_argument("path", nargs="?", type=Path, default=Path.cwd(), help="workspace root")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--sync",
        action="store_true",
        help="fetch the team's vectors first (fresh index), then sync the index to the backend "
        "(backend.url and backend.token, or the flags below; see docs/sync.md)",
    )
    parser.add_argument("--backend-url", help="backend for --sync")
    parser.add_argument("--token", help="tenant token for --sync")
    _common(parser)
    args = parser.parse_args(argv)
    _logging(args.verbose)
    root = args.path.resolve()
    if not root.is_dir():
        print(f"tabloop index: {root} is not a directory", file=sys.stderr)
        return 2
    resolved = resolve_settings(root, args)
    _report_problems("tabloop index", resolved)
    settings = resolved.settings
    try:
        cache_dir = settings.cache_path()
    except OSError as exc:
        print(f"tabloop index: cannot create the cache directory: {exc}", file=sys.stderr)
        return 1
    bar = StageProgress(enabled=not args.no_progress)
    bar.begin(LOAD)
    started = time.perf_counter()
    synced: dict[str, Any] = {}
    try:
        if args.sync:
            index, stats, synced = run_index_with_sync(root, settings, cache_dir, bar)
        else:
            index, stats = run_index(root, settings.index, cache_dir, bar)
    except RuntimeError as exc:
        bar.close()
        print(f"tabloop index: {exc}", file=sys.stderr)
        return 1
    bar.close()
    status = index.status()
    index.close()
    if status["state"] == "readonly":
        print("tabloop index: another process is indexing this workspace", file=sys.stderr)
        return 1
    report = {
        "root": str(root),
        "files_scanned": stats.files_scanned,
        "files_changed": stats.files_changed,
        "files_removed": stats.files_removed,
        "chunks_total": stats.chunks_total,
        "chunks_embedded": stats.chunks_embedded,
        "chunks_reused": stats.chunks_reused,
        "files_denied": stats.files_denied,
        "links_outside": stats.links_outside,
        "files_skipped": stats.files_skipped,
        "seconds": round(time.perf_counter() - started, 3),
        "merkle_root": status["merkleRoot"],
        **synced,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{report['files_scanned']} files ({report['files_changed']} changed), "
            f"{report['chunks_total']} chunks ({report['chunks_embedded']} embedded, "
            f"{report['chunks_reused']} reused) in {report['seconds']:.1f} s"
        )
    return 0


def print_hits(hits: list[SearchHit], stream: TextIO = sys.stdout, lines: int = 3) -> None:
    """Human-readable results: `path:start-end  score  symbols`, then the first lines."""
    for hit in hits:
        names = ", ".join(hit.symbols)
        print(
            f"{hit.path}:{hit.start_line + 1}-{hit.end_line}  {hit.score:.3f}  {names}", file=stream
        )
        for line in hit.preview.splitlines()[:lines]:
            print(f"    {line}", file=stream)


def hit_json(hit: SearchHit) -> dict[str, Any]:
    return {
        "path": hit.path,
        "start_line": hit.start_line,
        "end_line": hit.end_line,
        "score": round(hit.score, 4),
        "symbols": list(hit.symbols),
        "preview": hit.preview,
    }


def search_main(argv: list[str]) -> int:
    """`tabloop search "QUERY"`: the chunks of a workspace closest in meaning to QUERY."""
    parser = argparse.ArgumentParser(
        prog="tabloop search",
        description="Search a workspace by meaning. The index is brought up to date first "
        "(cheap when nothing changed).",
    )
    parser.add_argument("query", help="what you are looking for, in words or code")
    parser.add_argument("--path", type=Path, default=Path.cwd(), help="workspace root")
    parser.add_argument("-k", type=int, default=10, help="number of results (default 10)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    _common(parser)
    args = parser.parse_args(argv)
    _logging(args.verbose)
    root = args.path.resolve()
    if not root.is_dir():
        print(f"tabloop search: {root} is not a directory", file=sys.stderr)
        return 2
    if args.k < 1:
        print("tabloop search: -k must be at least 1", file=sys.stderr)
        return 2
    resolved = resolve_settings(root, args)
    _report_problems("tabloop search", resolved)
    settings = resolved.settings
    try:
        cache_dir = settings.cache_path()
    except OSError as exc:
        print(f"tabloop search: cannot create the cache directory: {exc}", file=sys.stderr)
        return 1
    bar = StageProgress(enabled=not args.no_progress)
    bar.begin(LOAD)
    try:
        index, _ = run_index(root, settings.index, cache_dir, bar)
    except RuntimeError as exc:
        bar.close()
        print(f"tabloop search: {exc}", file=sys.stderr)
        return 1
    bar.close()
    try:
        hits = index.search(args.query, args.k)
    finally:
        index.close()
    if args.json:
        print(json.dumps({"query": args.query, "hits": [hit_json(h) for h in hits]}))
    else:
        print_hits(hits)
    return 0
