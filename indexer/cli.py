"""`tabloop index` and `tabloop search`, and the indexing step of the demo.

The index lives in the cache directory: `--cache-dir`, else `$TABLOOP_CACHE_DIR`, else the
platform's cache directory (the same default as the server's `cacheDir` setting).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import platformdirs

from indexer.pipeline import IndexStats
from indexer.progress import LOAD, StageProgress
from indexer.service import WorkspaceIndex, index_workspace
from indexer.settings import IndexSettings
from indexer.types import SearchHit


def default_cache_dir() -> Path:
    """`$TABLOOP_CACHE_DIR`, else the platform's cache directory for tabloop."""
    configured = os.environ.get("TABLOOP_CACHE_DIR", "")
    path = Path(configured).expanduser() if configured else platformdirs.user_cache_path("tabloop")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache-dir", type=Path, help="where indexes live (default: see above)")
    parser.add_argument(
        "--model", default=None, help="embedding model: `bundled`, a name or a local path"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv debug)")


def _settings(args: argparse.Namespace) -> IndexSettings:
    settings = IndexSettings()
    if args.model:
        settings = settings.model_copy(update={"embedding_model": args.model})
    return settings


def _logging(verbose: int) -> None:
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(
        level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )


def run_index(
    root: Path,
    settings: IndexSettings,
    cache_dir: Path,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[WorkspaceIndex, IndexStats]:
    """Index `root` in the foreground; raises RuntimeError when indexing failed."""
    index, stats = index_workspace(root, settings, cache_dir, progress)
    status = index.status()
    if status["state"] == "failed" or (stats is None and status["state"] != "readonly"):
        index.close()
        raise RuntimeError(status["error"] or "indexing failed")
    return index, stats or IndexStats()


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
        "($TABLOOP_TELEMETRY__BACKEND_URL, $TABLOOP_TELEMETRY__TOKEN; see docs/sync.md)",
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
    bar = StageProgress(enabled=not args.no_progress)
    bar.begin(LOAD)
    started = time.perf_counter()
    synced: dict[str, Any] = {}
    try:
        cache_dir = args.cache_dir or default_cache_dir()
        if args.sync:
            from indexer.sync_setup import sync_index_main

            index, stats, synced = sync_index_main(root, _settings(args), cache_dir, args, bar)
        else:
            index, stats = run_index(root, _settings(args), cache_dir, bar)
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
    bar = StageProgress(enabled=not args.no_progress)
    bar.begin(LOAD)
    try:
        index, _ = run_index(root, _settings(args), args.cache_dir or default_cache_dir(), bar)
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


def index_and_search(
    root: Path,
    queries: list[str],
    cache_dir: Path,
    settings: IndexSettings | None = None,
    stream: TextIO = sys.stderr,
    k: int = 3,
) -> dict[str, list[SearchHit]]:
    """For the demo: index `root` with a visible progress bar, then run each query."""
    bar = StageProgress(stream)
    bar.begin(LOAD)
    index, stats = run_index(root, settings or IndexSettings(), cache_dir, bar)
    bar.close()
    print(
        f"indexed {stats.files_scanned} files: {stats.chunks_total} chunks "
        f"({stats.chunks_embedded} embedded, {stats.chunks_reused} reused)",
        file=stream,
    )
    results: dict[str, list[SearchHit]] = {}
    try:
        for query in queries:
            results[query] = index.search(query, k)
            print(f"\nsearch: {query}", file=stream)
            print_hits(results[query], stream)
    finally:
        index.close()
    return results
