"""Training examples as shards read by litdata's `StreamingDataset`: written once per run, read by
every process, each its share, resumed exactly from a position counted over all processes.

A run's examples (the backend exports a tenant's training window: `backend.adapters.shards`) are
written epoch by epoch, each epoch in the exact order the stream gives it (for the window: its
`TrainingWindow.epoch(seed, e)`), with litdata's `BinaryWriter` into `epoch-NNNN/` under the
run's shard directory (chunk files and litdata's `index.json`), and a `manifest.json` beside them
that records what they were made from (`identity`: for a tenant, the window's mark, the newest
event row, the window's settings and the seed), each epoch's count, the SHA-256 of its keys in
order and of every file. Each record holds the `FimExample` fields the trainer encodes, its index
in the epoch, its key (time, row) and the SHA-256 of all of them.

Reading (`rank_stream`): the examples of all epochs form one sequence, its *global positions*;
process `rank` of `world_size` reads the positions `p >= position` with `p % world_size == rank`
(newest first in every process, as the window wants), so `position` (examples consumed by all
processes together, every one below it consumed) resumes a run exactly, on any number of
processes. With one process the order is the epochs' order. litdata does the reading and the
per-process split: its elastic resume (litdata >= 0.2.76) restripes an epoch's canonical order
(the one-process order) onto `world_size` processes from a state whose `sample_in_epoch` is the
position in that epoch. What is added here, and why:

- the state is the one-process reader's (`StreamingDataset.state_dict`), with
  `num_samples_yielded` 0 and `resume_mode` "elastic": litdata checks `num_samples_yielded`
  against the new process's share of the epoch, which refuses a position from another number of
  processes past that share, and its strict (same-topology) replay would split the epoch by
  chunks, not by position;
- litdata rounds the skipped prefix down to a whole global batch (`world_size` examples), which
  would give again the up to `world_size - 1` examples just below `position`: they are dropped;
- the process and the number of processes are set on the dataset (`distributed_env`), not
  detected from torch.distributed, so a caller (and a test) can read any rank's share;
- each epoch's indices are checked to come in the expected sequence and each record against its
  SHA-256, and a local shard directory's files against the manifest before anything is read: a
  damaged, missing or reordered shard is a `ShardError`, never a silently shorter stream.

How the trainer calls it (`training.trainer.Trainer.run` takes a `Callable[[], Iterator]`):

    stream = rank_stream(shards, 0, 1)                      # every process: the whole stream;
    trainer.run(stream, budget)                             # the trainer takes its share of a
                                                            # step and skips `position` itself
    # or, a trainer that reads only its own share and resumes at its checkpoint's `position`:
    stream = rank_stream(shards, rank, world_size, position)

The shards are a directory on this machine by default, read in place; `location` may be any URL
litdata reads (`s3://`, `gs://`, `azure://`, `r2://`, or `local:/dir`, a directory read as such
a store), whose chunks litdata downloads to `cache_dir`; the manifest is read through fsspec
(`local:` directly) and only records are checked there, not files.
The workspace's own training (`training.workspace`) does not use shards: it reads its feedback
and code directly in one process.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from completion.bundled import file_sha256
from training.examples import FimExample

MANIFEST = "manifest.json"
FORMAT = 1
DEFAULT_CHUNK_SIZE = 256  # records per litdata chunk file
LITDATA_LOCAL = "local:"
"""litdata's prefix of a directory read as a remote store is (downloaded to `cache_dir`)."""
_FIELDS = tuple(f for f in FimExample.__dataclass_fields__)

# litdata asks the package index for a newer version of itself whenever a dataset is made.
os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")


class ShardError(ValueError):
    """Shards that cannot be read as the manifest says (missing, damaged, reordered, made for
    another run); the message says which."""


@dataclass(frozen=True)
class StreamedExample:
    """One record of the shards: its global position, its key (time, row) and the example."""

    position: int
    key: tuple[float, int]
    example: FimExample


@dataclass(frozen=True)
class EpochShards:
    """One epoch's shard directory as the manifest records it."""

    count: int
    keys_sha256: str  # SHA-256 of the epoch's keys in order
    files: dict[str, str]  # file name -> SHA-256


@dataclass(frozen=True)
class ShardManifest:
    """What a run's shards were made from, and each epoch's shards."""

    identity: dict[str, Any]
    summary: dict[str, Any]
    epochs: tuple[EpochShards, ...]
    chunk_size: int = DEFAULT_CHUNK_SIZE
    format: int = FORMAT

    @property
    def total(self) -> int:
        """Examples in all epochs together."""
        return sum(e.count for e in self.epochs)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> ShardManifest:
        try:
            data = json.loads(text)
            if data.get("format") != FORMAT:
                raise ShardError(f"{where}: shard manifest format {data.get('format')!r}")
            epochs = tuple(EpochShards(**e) for e in data["epochs"])
            return cls(data["identity"], data["summary"], epochs, int(data["chunk_size"]))
        except ShardError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ShardError(f"{where}: unreadable shard manifest ({exc})") from None


def epoch_name(epoch: int) -> str:
    return f"epoch-{epoch:04d}"


def keys_digest(keys: Iterable[tuple[float, int]]) -> str:
    return hashlib.sha256(json.dumps([list(k) for k in keys]).encode()).hexdigest()


def _record_digest(index: int, key: Sequence[Any], fields: Sequence[Any]) -> str:
    text = json.dumps([index, float(key[0]), int(key[1]), *fields], ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def write_epoch(
    directory: Path,
    examples: Iterable[tuple[tuple[float, int], FimExample]],
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> EpochShards:
    """Write one epoch's (key, example) pairs in their order as litdata shards in `directory`
    (made, or emptied first); its manifest entry. One process writes (litdata's writer waits
    for the index of every process it detects)."""
    import shutil

    from litdata.streaming.writer import BinaryWriter
    from litdata.utilities.env import _DistributedEnv

    if _DistributedEnv.detect().world_size != 1:
        raise ShardError("shards are written by one process, before the training processes start")
    shutil.rmtree(directory, ignore_errors=True)
    writer = BinaryWriter(str(directory), chunk_size=chunk_size)
    keys: list[tuple[float, int]] = []
    for index, (key, example) in enumerate(examples):
        fields = [getattr(example, name) for name in _FIELDS]
        record = {name: value for name, value in zip(_FIELDS, fields, strict=True)}
        record.update(
            index=index,
            time=float(key[0]),
            row=int(key[1]),
            sha256=_record_digest(index, key, fields),
        )
        writer[index] = record
        keys.append((float(key[0]), int(key[1])))
    if keys:
        writer.done()
        writer.merge(1)
    files = {p.name: file_sha256(p) for p in sorted(directory.iterdir()) if p.is_file()}
    return EpochShards(len(keys), keys_digest(keys), files)


def read_manifest(location: str | Path) -> ShardManifest:
    """The manifest of the shards at `location` (a directory or a URL fsspec opens)."""
    where = f"{location}/{MANIFEST}"
    if _is_local(location) or str(location).startswith(LITDATA_LOCAL):
        path = Path(str(location).removeprefix(LITDATA_LOCAL)) / MANIFEST
        if not path.is_file():
            raise ShardError(f"{where}: no shard manifest")
        return ShardManifest.from_json(path.read_text(), where)
    import fsspec

    try:
        with fsspec.open(where, "r") as handle:
            text = handle.read()
    except (OSError, FileNotFoundError) as exc:
        raise ShardError(f"{where}: no shard manifest ({exc})") from None
    return ShardManifest.from_json(text, where)


def _is_local(location: str | Path) -> bool:
    """Whether the shards are a directory read in place (else litdata downloads them)."""
    return isinstance(location, Path) or not (
        "://" in location or location.startswith(LITDATA_LOCAL)
    )


def verify_local(location: str | Path, manifest: ShardManifest) -> None:
    """Every file of every epoch on this machine matches its SHA-256 (ShardError otherwise)."""
    for number, epoch in enumerate(manifest.epochs):
        directory = Path(location) / epoch_name(number)
        for name, digest in epoch.files.items():
            path = directory / name
            if not path.is_file():
                raise ShardError(f"{path}: missing shard file")
            if file_sha256(path) != digest:
                raise ShardError(f"{path}: does not match its SHA-256 in the manifest")


def _epoch_dataset(
    location: str, cache_dir: str | None, rank: int, world_size: int, start: int
) -> Any:
    """litdata's dataset over one epoch, process `rank` of `world_size`, resumed at `start`."""
    from litdata import StreamingDataset
    from litdata.utilities.env import _DistributedEnv

    one = StreamingDataset(location, cache_dir=cache_dir, drop_last=False)
    one.distributed_env = _DistributedEnv(1, 0, 1)
    state = one.state_dict(0, 1, 1)  # the one-process reader's state, at the epoch's start
    state.update(sample_in_epoch=start, resume_mode="elastic")
    dataset = StreamingDataset(location, cache_dir=cache_dir, drop_last=False)
    dataset.distributed_env = _DistributedEnv(world_size, rank, 1)
    dataset.load_state_dict(state)
    return dataset


def _records(location: str, cache_dir: str | None, rank: int, world: int, start: int) -> Any:
    try:
        yield from _epoch_dataset(location, cache_dir, rank, world, start)
    except ShardError:
        raise
    except Exception as exc:  # litdata's own errors: a chunk it cannot read or decode
        raise ShardError(f"{location}: unreadable shards ({type(exc).__name__}: {exc})") from exc


def _checked(record: dict[str, Any], where: str) -> tuple[int, tuple[float, int], list[Any]]:
    """(index, key, example fields) of a record that matches its SHA-256 (ShardError else)."""
    try:
        fields = [record[name] for name in _FIELDS]
        index, key = int(record["index"]), (float(record["time"]), int(record["row"]))
        intact = record["sha256"] == _record_digest(index, key, fields)
    except (KeyError, TypeError, ValueError):
        intact = False
    if not intact:
        raise ShardError(f"{where}: a record does not match its SHA-256 (damaged shard)")
    return index, key, fields


def rank_examples(
    location: str | Path,
    rank: int = 0,
    world_size: int = 1,
    position: int = 0,
    *,
    cache_dir: str | Path | None = None,
    manifest: ShardManifest | None = None,
) -> Iterator[StreamedExample]:
    """Process `rank` of `world_size`'s share of the shards from global `position` on: the
    positions `p >= position` with `p % world_size == rank`, in order, epoch after epoch."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} of {world_size} processes")
    if position < 0:
        raise ValueError(f"position must be at least 0, not {position}")
    if manifest is None:
        manifest = read_manifest(location)
        if _is_local(location):
            verify_local(location, manifest)
    base = str(location).rstrip("/")
    cache = str(cache_dir) if cache_dir is not None else None
    offset = 0
    for number, epoch in enumerate(manifest.epochs):
        first, offset = offset, offset + epoch.count
        if position >= offset or epoch.count == 0:
            continue
        start = max(0, position - first)
        own = (rank - first) % world_size  # the process's rank within this epoch's striping
        expected = start + (own - start) % world_size
        where = f"{base}/{epoch_name(number)}"
        for record in _records(where, cache, own, world_size, start):
            index, key, fields = _checked(record, where)
            if start - world_size < index < start:
                continue  # litdata rounds the skipped prefix down to whole global batches
            if index != expected:
                raise ShardError(f"{where}: record {index} where {expected} was due")
            example = FimExample(**dict(zip(_FIELDS, fields, strict=True)))
            yield StreamedExample(first + index, key, example)
            expected += world_size
        if expected < epoch.count:
            raise ShardError(f"{where}: ended before record {expected} of {epoch.count}")


def rank_stream(
    location: str | Path,
    rank: int = 0,
    world_size: int = 1,
    position: int = 0,
    *,
    cache_dir: str | Path | None = None,
) -> Callable[[], Iterator[FimExample]]:
    """A factory of process `rank`'s examples (`rank_examples`), as `Trainer.run` takes a
    stream: each call reads them again from `position`. The manifest is read (and a local
    directory's files checked) once here, so a missing or damaged shard fails before training."""
    manifest = read_manifest(location)
    if _is_local(location):
        verify_local(location, manifest)

    def make() -> Iterator[FimExample]:
        for item in rank_examples(
            location, rank, world_size, position, cache_dir=cache_dir, manifest=manifest
        ):
            yield item.example

    return make
