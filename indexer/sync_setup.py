"""Wiring the index sync: a syncer for a running `WorkspaceIndex`, and the steps of
`tabloop index --sync` (the command, in `indexer.cli`, puts them in order around indexing).

The backend and token are the client's shared ones (`backend.url`, `backend.token`); the
secret is `index.syncSecret`, else one generated into `<cache dir>/sync/secret` (mode 0600).
Everything arrives as typed settings, resolved by the caller from the configuration's layers.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from common.endpoint import BackendEndpoint
from indexer.embed import EmbeddingCache
from indexer.embed_onnx import load_embedder
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


def sync_client(endpoint: BackendEndpoint) -> SyncClient:
    """A client of the configured backend (close it); RuntimeError when one is not configured."""
    if not endpoint.url or not endpoint.token:
        raise RuntimeError(
            "--sync needs --backend-url and --token (or backend.url and backend.token in a "
            "configuration file, or $TABLOOP_BACKEND__URL and $TABLOOP_BACKEND__TOKEN)"
        )
    return SyncClient(endpoint.url, endpoint.token)


def prefetch_for_new_index(
    root: Path, settings: IndexSettings, cache_dir: Path, keys: SyncKeys, client: SyncClient
) -> dict[str, Any]:
    """Before the first index of `root` in `cache_dir`: fetch the team's vectors into the
    embedding cache, so indexing embeds only what nobody has embedded yet.

    Returns `{"reuse": figures}` when it fetched, `{}` when an index exists already or the
    backend could not be reached (indexing then starts from scratch).
    """
    if (index_dir(cache_dir, root) / "meta.sqlite3").exists():
        return {}
    embedder = load_embedder(
        settings.embedding_model,
        cache_dir=cache_dir,
        batch_size=settings.embed_batch_size,
        engine=settings.embedding_engine,
    )
    cache = EmbeddingCache(cache_dir / "embeddings.sqlite3")
    try:
        return {"reuse": asdict(prefetch_vectors(root, settings, embedder, cache, keys, client))}
    except (SyncFailed, SyncRejected) as exc:
        log.warning("could not fetch the team's vectors: %s", exc)
        return {}
    finally:
        cache.close()


def push_index(index: WorkspaceIndex, keys: SyncKeys, client: SyncClient) -> dict[str, Any]:
    """Sync a freshly built index to the backend; `{"sync": figures}`, RuntimeError on failure
    (the caller still owns, and closes, the index)."""
    if index.store is None:
        raise RuntimeError("indexed, but the index is not open for writing; nothing was synced")
    try:
        report = sync_index(index.store, keys, client, keys.workspace(str(index.root)))
    except (SyncFailed, SyncRejected, IndexChanged) as exc:
        raise RuntimeError(f"indexed, but the sync failed: {exc}") from exc
    return {"sync": report.as_json()}
