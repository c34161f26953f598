"""Wiring the index sync: a syncer for a running `WorkspaceIndex`, and `tabloop index --sync`.

The backend and token are the telemetry ones (`telemetry.backendUrl`, `telemetry.token`); the
secret is `index.syncSecret`, else one generated into `<cache dir>/sync/secret` (mode 0600).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from indexer.embed import EmbeddingCache, SentenceTransformerEmbedder
from indexer.pipeline import IndexStats
from indexer.service import WorkspaceIndex
from indexer.settings import IndexSettings
from indexer.store import index_dir
from indexer.sync import IndexChanged, IndexSyncer, prefetch_vectors, sync_index
from indexer.sync_client import SyncClient, SyncFailed, SyncRejected
from indexer.sync_keys import SyncKeys, load_or_create_secret

log = logging.getLogger(__name__)

SECRET_DIR = "sync"


def sync_keys(cache_dir: Path, secret: str = "") -> SyncKeys:
    """Keys from the configured secret, else from the one kept in the cache directory."""
    return SyncKeys(secret or load_or_create_secret(cache_dir / SECRET_DIR))


def syncer_for_index(
    index: WorkspaceIndex,
    backend_url: str,
    token: str,
    *,
    secret: str = "",
    **options: Any,
) -> IndexSyncer:
    """An `IndexSyncer` that follows `index` (start it; close it before the index).

    It syncs after the index's Merkle root changed and settled (debounced), every
    `interval_s`, and on `sync_now()`; it never blocks the index or its searches.
    """

    def store() -> Any:
        return index.store if index.indexer is not None else None

    def local_root() -> bytes | None:
        writer = index.indexer
        return writer.tree.root_hash if writer is not None else None

    return IndexSyncer(
        store,
        local_root,
        SyncClient(backend_url, token),
        sync_keys(index.cache_dir, secret),
        str(index.root),
        **options,
    )


def sync_index_main(
    root: Path,
    settings: IndexSettings,
    cache_dir: Path,
    args: argparse.Namespace,
    progress: Callable[[str, int, int], None] | None = None,
) -> tuple[WorkspaceIndex, IndexStats, dict[str, Any]]:
    """`tabloop index --sync`: prefetch the team's vectors when there is no local index yet,
    index, then sync. Raises RuntimeError with a message for the terminal; the caller closes
    the returned index."""
    from indexer.cli import run_index

    url = args.backend_url or os.environ.get("TABLOOP_TELEMETRY__BACKEND_URL", "")
    token = args.token or os.environ.get("TABLOOP_TELEMETRY__TOKEN", "")
    if not url or not token:
        raise RuntimeError(
            "--sync needs --backend-url and --token (or $TABLOOP_TELEMETRY__BACKEND_URL and "
            "$TABLOOP_TELEMETRY__TOKEN)"
        )
    secret = settings.sync_secret or os.environ.get("TABLOOP_INDEX__SYNC_SECRET", "")
    keys = sync_keys(cache_dir, secret)
    client = SyncClient(url, token)
    figures: dict[str, Any] = {}
    try:
        if not (index_dir(cache_dir, root) / "meta.sqlite3").exists():
            embedder = SentenceTransformerEmbedder(
                settings.embedding_model, batch_size=settings.embed_batch_size
            )
            cache = EmbeddingCache(cache_dir / "embeddings.sqlite3")
            try:
                figures["reuse"] = asdict(
                    prefetch_vectors(root, settings, embedder, cache, keys, client)
                )
            except (SyncFailed, SyncRejected) as exc:  # index anyway, from scratch
                log.warning("could not fetch the team's vectors: %s", exc)
            finally:
                cache.close()
        index, stats = run_index(root, settings, cache_dir, progress)
        try:
            assert index.store is not None
            report = sync_index(index.store, keys, client, keys.workspace(str(root)))
        except (SyncFailed, SyncRejected, IndexChanged) as exc:
            index.close()
            raise RuntimeError(f"indexed, but the sync failed: {exc}") from exc
        figures["sync"] = report.as_json()
        return index, stats, figures
    finally:
        client.close()
