"""`tabloop bench sync`: what the index sync costs on the wire, and what reuse saves.

On a copy of a real tree (default: the standard library's `email` package), with the configured
embedding model (bundled all-MiniLM-L6-v2 by default) and a backend started on loopback:

- `cold_first_query_s`: from nothing (empty cache, no server) to the first search answer: scan,
  chunk, embed every chunk, search. This is the baseline of the reuse figure.
- `full_sync_bytes` / `full_sync_bytes_per_chunk`: the first sync of that index (request and
  response bodies, as sent: gzipped JSON, float16 vectors).
- `one_file_sync_bytes` / `one_file_sync_ms`: after appending a function to one file and
  re-indexing it, the next sync (goal: at most 10,000 bytes); the full sync is its baseline.
- `reuse_first_query_s`: a teammate's fresh clone (other path, empty cache, same secret and
  model) to its first search answer: prefetch the team's vectors, index (embedding nothing the
  server had), search. `reuse_speedup` = cold / reuse (goal: at least 10).

Both first-query timings include loading the embedding model (the query must be embedded), and
neither includes importing torch (done once before timing), so the ratio is not flattered.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

from backend.local import LocalBackend
from indexer.embed import EmbeddingCache, SentenceTransformerEmbedder
from indexer.service import WorkspaceIndex
from indexer.settings import IndexSettings
from indexer.sync import prefetch_vectors, sync_index
from indexer.sync_client import SyncClient
from indexer.sync_keys import SyncKeys

DEFAULT_TREE = Path(sysconfig.get_paths()["stdlib"]) / "email"
QUERY = "parse the headers of an email message"
ADDED = '''

def bench_added_function(items, key=None):
    """Return the items sorted by key, dropping duplicates."""
    seen = set()
    out = []
    for item in sorted(items, key=key):
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out
'''


def _settings(model: str) -> IndexSettings:
    return IndexSettings(embedding_model=model, watch=False, rescan_interval_s=0.0)


def _first_query(
    root: Path, cache_dir: Path, settings: IndexSettings
) -> tuple[WorkspaceIndex, float, dict[str, Any]]:
    """Index `root` from what `cache_dir` holds and answer one query; (index, seconds, stats)."""
    started = time.perf_counter()
    index = WorkspaceIndex(root, settings, cache_dir)
    index.start()
    index.wait_idle()
    hits = index.search(QUERY, k=5)
    seconds = time.perf_counter() - started
    stats = index.last_stats
    if not hits or stats is None:
        raise RuntimeError(f"indexing {root} failed: {index.status()}")
    return (
        index,
        seconds,
        {
            "files": stats.files_scanned,
            "chunks": stats.chunks_total,
            "chunks_embedded": stats.chunks_embedded,
            "top_hit": f"{hits[0].path}:{hits[0].start_line + 1}",
        },
    )


def _edited_file(root: Path) -> Path:
    """A Python file of median size: a typical edit."""
    files = sorted(root.rglob("*.py"), key=lambda p: p.stat().st_size)
    if not files:
        raise RuntimeError(f"no Python file under {root}")
    return files[len(files) // 2]


def run(tree: Path, model: str, work: Path) -> dict[str, Any]:
    settings = _settings(model)
    # Imports and page cache warm for both timings alike.
    SentenceTransformerEmbedder(model).embed(["warm up"])

    alice = work / "alice" / tree.name
    shutil.copytree(tree, alice, ignore=shutil.ignore_patterns("__pycache__"))
    index, cold_s, cold = _first_query(alice, work / "alice-cache", settings)

    backend = LocalBackend(f"sqlite:///{work / 'backend.sqlite3'}", tenant="bench").start()
    keys = SyncKeys("bench team secret")
    client = SyncClient(backend.url, backend.token)
    try:
        assert index.store is not None
        workspace = keys.workspace(str(alice))
        full = sync_index(index.store, keys, client, workspace)

        edited = _edited_file(alice)
        edited.write_text(edited.read_text(encoding="utf-8") + ADDED, encoding="utf-8")
        index.update_document(edited, None)
        index.wait_idle()
        one = sync_index(index.store, keys, client, workspace)
        index.close()

        bob = work / "bob" / tree.name
        shutil.copytree(alice, bob)
        started = time.perf_counter()
        cache = EmbeddingCache(work / "bob-cache" / "embeddings.sqlite3")
        embedder = SentenceTransformerEmbedder(model)  # lazy: reads config files only
        reuse = prefetch_vectors(bob, settings, embedder, cache, keys, client)
        cache.close()
        bob_index, _, warm = _first_query(bob, work / "bob-cache", settings)
        reuse_s = time.perf_counter() - started
        bob_index.close()
    finally:
        client.close()
        backend.stop()

    return {
        "tree": str(tree),
        "model": model,
        "files": cold["files"],
        "chunks": cold["chunks"],
        "cold_first_query_s": round(cold_s, 3),
        "cold_chunks_embedded": cold["chunks_embedded"],
        "reuse_first_query_s": round(reuse_s, 3),
        "reuse_prefetch_s": round(reuse.seconds, 3),
        "reuse_vectors_fetched": reuse.fetched,
        "reuse_bytes_received": reuse.bytes_received,
        "reuse_chunks_embedded": warm["chunks_embedded"],
        "reuse_speedup": round(cold_s / reuse_s, 2),
        "top_hit_cold": cold["top_hit"],
        "top_hit_reuse": warm["top_hit"],
        "full_sync_bytes": full.bytes_sent + full.bytes_received,
        "full_sync_requests": full.requests,
        "full_sync_s": round(full.seconds, 3),
        "full_sync_bytes_per_chunk": round(
            (full.bytes_sent + full.bytes_received) / max(cold["chunks"], 1), 1
        ),
        "edited_file": str(edited.relative_to(alice)),
        "one_file_sync_bytes": one.bytes_sent + one.bytes_received,
        "one_file_sync_bytes_sent": one.bytes_sent,
        "one_file_sync_ms": round(one.seconds * 1000, 1),
        "one_file_sync_requests": one.requests,
        "one_file_node_hashes": one.node_hashes_received,
        "one_file_vectors_uploaded": one.vectors_uploaded,
        "one_file_chunks_placed": one.chunks_placed,
        "one_file_vs_full_sync": round(
            (one.bytes_sent + one.bytes_received) / max(full.bytes_sent + full.bytes_received, 1),
            4,
        ),
    }


def main(argv: list[str]) -> int:
    """Entry point of `tabloop bench sync`."""
    parser = argparse.ArgumentParser(prog="tabloop bench sync", description=__doc__.split("\n")[0])
    parser.add_argument("--path", type=Path, default=DEFAULT_TREE, help="tree to copy and index")
    parser.add_argument("--model", default="bundled", help="embedding model (default: bundled)")
    parser.add_argument("--json", action="store_true", help="one JSON object (always JSON)")
    args = parser.parse_args(argv)
    tree = args.path.resolve()
    if not tree.is_dir():
        print(f"tabloop bench sync: {tree} is not a directory", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="tabloop-bench-sync-") as work:
        report = run(tree, args.model, Path(work))
    print(json.dumps(report, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
