"""A tenant's training window exported as litdata shards and read back per process: the window's
order, each example once over the processes, exact resume on another number of processes, and
damaged shards refused (real litdata, real shards in temporary directories, real PostgreSQL)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from backend.adapters.dataset import TenantExamples, newest_event_row
from backend.adapters.shards import epochs_for, export_window
from backend.storage import Storage
from tests.backend.adapters.events import logged, post
from tests.support.backend_server import BackendServer
from training.budget import Budget
from training.examples import FimExample
from training.lora import LoraShape
from training.streamed import (
    MANIFEST,
    ShardError,
    ShardManifest,
    epoch_name,
    rank_examples,
    rank_stream,
    read_manifest,
    write_epoch,
)
from training.trainer import TrainSettings
from training.window import WindowSettings

SEED = 7
WINDOW = WindowSettings(replay_share=0.25, held_out_share=0.2)


@pytest.fixture
def pg_backend(postgres_db: str) -> Iterator[BackendServer]:
    with BackendServer(postgres_db) as server:
        yield server


class _NoDatabase(Storage):
    """A storage that must not be read."""

    def __init__(self) -> None:
        pass

    def session(self) -> object:  # type: ignore[override]
        raise AssertionError("the database was read")


def _window(backend: BackendServer) -> TenantExamples:
    """40 decisions; a mark at the 20th oldest, so epochs replay older ones."""
    post(backend, logged(40))
    storage = backend.services.storage
    upto = newest_event_row(storage, backend.tenant_id)
    everything = TenantExamples(storage, backend.tenant_id, upto)
    mark = sorted(everything.window.trainable)[19]
    return TenantExamples(storage, backend.tenant_id, upto, mark=mark, window=WINDOW)


def _export(
    data: TenantExamples, directory: Path, epochs: int, storage: Storage, seed: int = SEED
) -> ShardManifest:
    return export_window(
        storage,
        data.tenant_id,
        data.upto_row,
        data.window.mark,
        WINDOW,
        seed,
        directory,
        epochs=epochs,
        chunk_size=4,  # several chunks an epoch
    )


def test_export_reads_back_in_the_windows_order_and_is_reused(
    pg_backend: BackendServer, tmp_path: Path
) -> None:
    data = _window(pg_backend)
    shards = tmp_path / "shards"
    _export(data, shards, 2, pg_backend.services.storage)
    expected = [
        (key, example)
        for epoch in range(2)
        for key, example in zip(
            data.window.epoch(SEED, epoch), data.training_examples(SEED, epoch), strict=True
        )
    ]
    assert data.window.replayed > 0 and len(expected) == 2 * data.train_count
    read = [(item.key, item.example) for item in rank_examples(shards)]
    assert read == expected
    assert list(rank_stream(shards)()) == [example for _, example in expected]
    manifest = read_manifest(shards)
    assert manifest.identity["seed"] == SEED and manifest.total == len(expected)
    assert manifest.identity["mark"] == list(data.window.mark or ())
    # The same run again: the shards are there, nothing is read from the database.
    assert _export(data, shards, 2, _NoDatabase()) == manifest
    # One more epoch: only it is written.
    _export(data, shards, 3, pg_backend.services.storage)
    grown = read_manifest(shards)
    assert grown.epochs[:2] == manifest.epochs and len(grown.epochs) == 3
    with pytest.raises(ShardError, match="another run"):
        _export(data, shards, 1, _NoDatabase(), seed=SEED + 1)


def test_processes_read_each_example_once_and_resume_on_another_count(
    pg_backend: BackendServer, tmp_path: Path
) -> None:
    data = _window(pg_backend)
    shards = tmp_path / "shards"
    _export(data, shards, 2, pg_backend.services.storage)
    total = read_manifest(shards).total
    whole = [(item.position, item.key) for item in rank_examples(shards)]
    assert [p for p, _ in whole] == list(range(total))

    two = [[(i.position, i.key) for i in rank_examples(shards, rank, 2)] for rank in range(2)]
    assert sorted(two[0] + two[1]) == whole  # every example once, none twice
    assert all(p % 2 == rank for rank in range(2) for p, _ in two[rank])

    # Two processes stop after 9 examples each: 18 consumed; one process takes over from there.
    readers = [rank_examples(shards, rank, 2) for rank in range(2)]
    seen = [(i.position, i.key) for r in readers for i in itertools.islice(r, 9)]
    rest = [(i.position, i.key) for i in rank_examples(shards, 0, 1, position=len(seen))]
    assert sorted(seen + rest) == whole

    # Three processes from a position that is not a multiple of three (across the epochs).
    position = data.train_count + 4
    three = [(i.position, i.key) for r in range(3) for i in rank_examples(shards, r, 3, position)]
    assert sorted(three) == whole[position:]


def _small_shards(directory: Path) -> None:
    examples = [
        ((1000.0 + k, k), FimExample("a.py", f"prefix {k}\n", f"middle {k}", "", "line"))
        for k in range(10)
    ]
    entry = write_epoch(directory / epoch_name(0), examples, chunk_size=3)
    manifest = {
        "format": 1,
        "identity": {},
        "summary": {},
        "chunk_size": 3,
        "epochs": [{"count": entry.count, "keys_sha256": entry.keys_sha256, "files": entry.files}],
    }
    (directory / MANIFEST).write_text(json.dumps(manifest))


def _chunk(directory: Path) -> Path:
    return sorted((directory / epoch_name(0)).glob("chunk-*.bin"))[1]


def test_a_damaged_or_missing_shard_is_refused(tmp_path: Path) -> None:
    _small_shards(tmp_path)
    assert len(list(rank_stream(tmp_path)())) == 10
    chunk = _chunk(tmp_path)
    original = chunk.read_bytes()
    chunk.write_bytes(original.replace(b"middle 4", b"middle 9"))
    with pytest.raises(ShardError, match="SHA-256"):
        rank_stream(tmp_path)
    chunk.unlink()
    with pytest.raises(ShardError, match="missing shard file"):
        rank_stream(tmp_path)
    (tmp_path / MANIFEST).write_text("{")
    with pytest.raises(ShardError, match="unreadable shard manifest"):
        rank_stream(tmp_path)


def test_a_damaged_record_is_refused_where_files_are_not_checked(tmp_path: Path) -> None:
    """Past the files' digests (shards at a URL are checked record by record): a changed text
    fails its record's SHA-256 instead of training on it."""
    _small_shards(tmp_path)
    chunk = _chunk(tmp_path)
    chunk.write_bytes(chunk.read_bytes().replace(b"middle 4", b"middle 9"))
    manifest = read_manifest(tmp_path)
    read = rank_examples(tmp_path, manifest=manifest)  # files not checked
    with pytest.raises(ShardError, match="SHA-256"):
        list(read)


def test_the_trainer_on_the_shards_trains_the_adapter_the_database_stream_trains(
    pg_backend: BackendServer, tiny_model_path: Path, tmp_path: Path
) -> None:
    from training.workspace import load_trainable

    data = _window(pg_backend)
    settings = TrainSettings(
        seed=SEED, effective_batch=4, micro_batch=2, max_prompt_tokens=64, lora=LoraShape(rank=4)
    )
    budget = Budget(samples=12)
    epochs = epochs_for(budget, data.train_count)
    assert epochs == 1
    _export(data, tmp_path / "shards", epochs, pg_backend.services.storage)
    digests = []
    for name, stream in (
        ("database", data.stream(SEED)),
        ("shards", rank_stream(tmp_path / "shards")),
    ):
        trainable = load_trainable(str(tiny_model_path), tmp_path / "cache", settings)
        result = trainable.trainer(settings, tmp_path / name, "cpu").run(stream, budget)
        assert result.samples == 12
        digests.append(result.weights_sha256)
    assert digests[0] == digests[1]


def test_shards_read_through_litdatas_download_path(tmp_path: Path) -> None:
    """`local:DIR` is read as litdata reads a remote store (chunks downloaded to `cache_dir`):
    the same records, and a changed text is refused by its record's SHA-256."""
    shards = tmp_path / "shards"
    shards.mkdir()
    _small_shards(shards)
    local = [(i.position, i.example) for i in rank_examples(shards, 1, 2, position=3)]
    remote = f"local:{shards}"
    fetched = rank_examples(remote, 1, 2, position=3, cache_dir=tmp_path / "cache-a")
    assert [(i.position, i.example) for i in fetched] == local
    assert [p for p, _ in local] == [3, 5, 7, 9]
    chunk = _chunk(shards)
    chunk.write_bytes(chunk.read_bytes().replace(b"middle 4", b"middle 9"))
    with pytest.raises(ShardError, match="SHA-256"):
        list(rank_stream(remote, cache_dir=tmp_path / "cache-b")())
