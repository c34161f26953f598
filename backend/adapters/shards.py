"""A tenant run's training window exported as shards (`training.streamed`), so that its training
processes read litdata shards instead of the event store, and a resumed run reads the same ones.

`export_window` writes, for epochs 0..n-1, the exact ordered examples the window gives that epoch
with the run's seed (`TenantExamples.training_examples`: new examples newest first with that
epoch's replayed older ones among them) into `epoch-NNNN/` of the run's shard directory, and a
manifest whose `identity` is what decides them: the tenant, the newest event row the run reads
(`through_event_id`), the serving version's mark, the window's settings and the seed. Called
again with the same identity it reads nothing from the database when the epochs asked for are
there, and writes only the missing ones otherwise; shards made for another identity are refused
(`ShardError`: a new plan needs a new directory).

How a tenant run is to use it (`backend.adapters.run` / `backend.adapters.launch` do not yet: they
read the event store in every process): the process that claims the job exports before it starts
the training processes,

    manifest = export_window(storage, tenant_id, plan.upto, plan.mark, window, seed,
                             run_dir / SHARDS, epochs=epochs_for(budget, count))
    stream = rank_stream(run_dir / SHARDS)            # in each training process

and the training processes need no database. How many epochs: the stream ends after the last
one exported, so a samples budget takes `ceil(samples / count)`; a time budget needs a bound.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

from backend.adapters.dataset import TenantExamples
from backend.storage import Storage
from training.budget import Budget
from training.examples import FimExample
from training.streamed import (
    DEFAULT_CHUNK_SIZE,
    MANIFEST,
    ShardError,
    ShardManifest,
    epoch_name,
    keys_digest,
    read_manifest,
    write_epoch,
)
from training.window import OutcomeKey, WindowSettings

SHARDS = "shards"
"""The shard directory's name in a run directory."""
DEFAULT_MAX_EPOCHS = 4


def window_identity(
    tenant_id: int, upto: int, mark: OutcomeKey | None, window: WindowSettings, seed: int
) -> dict[str, object]:
    """What decides a run's shards."""
    return {
        "tenant_id": tenant_id,
        "through_event_id": upto,
        "mark": list(mark) if mark is not None else None,
        "replay_share": window.replay_share,
        "held_out_share": window.held_out_share,
        "seed": seed,
    }


def epochs_for(budget: Budget, count: int, max_epochs: int = DEFAULT_MAX_EPOCHS) -> int:
    """Epochs a run with `budget` may read of a window with `count` examples an epoch: those a
    samples budget needs, else `max_epochs`."""
    if count <= 0:
        return 0
    if budget.samples is not None:
        return max(1, math.ceil(budget.samples / count))
    return max_epochs


def export_window(
    storage: Storage,
    tenant_id: int,
    upto: int,
    mark: OutcomeKey | None,
    window: WindowSettings,
    seed: int,
    directory: Path,
    *,
    epochs: int,
    data: TenantExamples | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> ShardManifest:
    """The shards of the tenant's window in `directory`, with at least `epochs` epochs: those
    already there when their identity matches, the missing ones written from the event store
    (through `data` when given, else a `TenantExamples` read here)."""
    identity = window_identity(tenant_id, upto, mark, window, seed)
    existing: ShardManifest | None = None
    if (directory / MANIFEST).exists():
        existing = read_manifest(directory)
        if existing.identity != identity:
            raise ShardError(
                f"{directory}: shards made for another run ({existing.identity}, not "
                f"{identity}); remove the directory to export this one"
            )
        if len(existing.epochs) >= epochs:
            return existing
    if data is None:
        data = TenantExamples(storage, tenant_id, upto, mark=mark, window=window)
    if (data.tenant_id, data.upto_row, data.window.mark) != (tenant_id, upto, mark):
        raise ValueError("the examples given are not the window asked for")
    directory.mkdir(parents=True, exist_ok=True)
    done = list(existing.epochs) if existing is not None else []
    summary = {**data.summary(), "window": data.window.summary()}
    for number in range(len(done), epochs):
        keys = data.window.epoch(seed, number)
        examples: Iterator[FimExample] = data.training_examples(seed, number)
        pairs = zip(keys, examples, strict=True)  # every key of the window is a row
        written = write_epoch(directory / epoch_name(number), pairs, chunk_size)
        if written.keys_sha256 != keys_digest(keys):
            raise ShardError(f"{directory}: epoch {number} was not written in the window's order")
        done.append(written)
    manifest = ShardManifest(identity, summary, tuple(done), chunk_size)
    partial = directory / f".{MANIFEST}.partial"
    partial.write_text(manifest.to_json())
    os.replace(partial, directory / MANIFEST)
    return manifest
