"""A backend tenant's adapter versions in the database, their files in a blob store.

`TenantAdapterRegistry` is `training.registry`'s registry with its state in the database
(`backend.adapters.models`) instead of a JSON file under a file lock: the same transitions, with
the same refusals (`training.registry.RegistryTransitions`: promote refuses a version that was
not evaluated against what serves now or shows no gain, and anything while a canary runs;
approvals, canary verdicts, rollback through the promotions), so every backend instance on one
database sees the same versions and the same serving one.

Every change runs in one transaction that holds the tenant's `adapter_registries` row: on
PostgreSQL the row is locked (`SELECT … FOR UPDATE`), on SQLite the transaction takes the write
lock at its start (`BEGIN IMMEDIATE`). Two instances promoting at once are serialised, and the
second sees the first's result (a canary running, a version serving already).

A version's files are blobs named by their SHA-256 (`backend.adapters.blobs`), the checksums in
its row. Each instance reads a version from its own copy under its cache directory
(`scope_dir(cache, tenant=T)/v0003`, `path`): the copy is checked against the row's checksums
before use and fetched again from the store when it is missing or does not match; a blob that
does not match its checksum is refused (`AdapterRegistryError`), never copied. No directory is
shared between instances.

A tenant whose adapters were kept in a file registry under this cache directory (before the
registry moved into the database) has it copied in on first use: its versions (their files
stored as blobs), serving state and log; the file is then renamed `registry.json.imported`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from backend.adapters.blobs import BlobError, BlobStore, default_blob_url
from backend.adapters.models import AdapterRegistryRow, AdapterTransitionRow, AdapterVersionRow
from backend.storage import Storage
from completion.adapters import CONFIG, MANIFEST, WEIGHTS, AdapterError, verify_adapter
from completion.bundled import file_sha256
from training.registry import (
    MAX_LOG,
    REGISTRY_FILE,
    AdapterRegistry,
    AdapterRegistryError,
    AdapterVersion,
    RegistryTransitions,
    empty_state,
    scope_dir,
    version_label,
)

log = logging.getLogger(__name__)

ADAPTER_FILES = (CONFIG, WEIGHTS)
IMPORTED_SUFFIX = ".imported"


def _time(value: datetime) -> float:
    """Unix seconds of a stored time (SQLite gives it back without its zone: UTC)."""
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


def _stamp(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def _document(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True)


def _entry_of(row: AdapterVersionRow) -> dict[str, Any]:
    """A version row in the state's dictionary form (`training.registry.AdapterVersion`)."""
    return {
        "version": row.number,
        "created": _time(row.created_at),
        "base_model": row.base_model,
        "status": row.status,
        "train": json.loads(row.train),
        "evaluation": json.loads(row.evaluation) if row.evaluation is not None else None,
    }


def transitions_of(session: Session, tenant_id: int) -> list[dict[str, Any]]:
    """The newest `MAX_LOG` logged transitions of a tenant's adapters, oldest first, as
    `AdapterRegistry.transitions` gives them (`at` in Unix seconds)."""
    rows = session.scalars(
        select(AdapterTransitionRow)
        .where(AdapterTransitionRow.tenant_id == tenant_id)
        .order_by(AdapterTransitionRow.id.desc())
        .limit(MAX_LOG)
    ).all()
    return [
        {
            "at": _time(row.at),
            "action": row.action,
            "version": row.version,
            "actor": row.actor,
            "reason": row.reason,
            "figures": json.loads(row.figures) if row.figures is not None else None,
        }
        for row in reversed(rows)
    ]


class TenantAdapterRegistry(RegistryTransitions):
    """The adapter versions of one tenant (`training.registry.AdapterVersions`), in the database;
    `root` is this instance's local directory of the tenant (version copies, the run)."""

    def __init__(
        self, storage: Storage, tenant_id: int, tenant: str, root: Path, blobs: BlobStore
    ) -> None:
        self.storage = storage
        self.tenant_id = tenant_id
        self.tenant = tenant
        self.root = root
        self.blobs = blobs

    def _scope(self) -> str:
        return f"tenant {self.tenant}'s registry"

    # -- the state ------------------------------------------------------------------------

    @contextmanager
    def _serialised(self) -> Iterator[Session]:
        """A session whose transaction holds the tenant's registry row (created when missing)
        until it ends."""
        with self.storage.session() as session:
            if self.storage.dialect == "sqlite":
                session.execute(text("BEGIN IMMEDIATE"))
                if session.get(AdapterRegistryRow, self.tenant_id) is None:
                    session.add(
                        AdapterRegistryRow(tenant_id=self.tenant_id, history=[], pending=[])
                    )
                    session.flush()
            else:
                session.execute(
                    pg_insert(AdapterRegistryRow)
                    .values(tenant_id=self.tenant_id, history=[], pending=[])
                    .on_conflict_do_nothing(index_elements=["tenant_id"])
                )
                session.execute(
                    select(AdapterRegistryRow.tenant_id)
                    .where(AdapterRegistryRow.tenant_id == self.tenant_id)
                    .with_for_update()
                )
            yield session

    def _rows(self, session: Session) -> list[AdapterVersionRow]:
        return list(
            session.scalars(
                select(AdapterVersionRow)
                .where(AdapterVersionRow.tenant_id == self.tenant_id)
                .order_by(AdapterVersionRow.number)
            ).all()
        )

    def _state_in(self, session: Session) -> dict[str, Any]:
        state = empty_state()
        head = session.get(AdapterRegistryRow, self.tenant_id)
        if head is not None:
            state.update(
                serving=head.serving,
                history=list(head.history),
                canary=dict(head.canary) if head.canary is not None else None,
                pending=list(head.pending),
            )
        rows = self._rows(session)
        state["versions"] = [_entry_of(row) for row in rows]
        state["files"] = {row.number: dict(row.files) for row in rows}
        return state

    @contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        self._adopt_file_registry()
        with self._serialised() as session:
            state = self._state_in(session)
            before = json.dumps(state, sort_keys=True)
            yield state
            if json.dumps(state, sort_keys=True) != before:
                self._store(session, state)
                session.commit()

    def _store(self, session: Session, state: dict[str, Any]) -> None:
        """Write back what a transition changed: the versions' status and evaluation, the
        serving state, and the log entries it appended."""
        rows = {row.number: row for row in self._rows(session)}
        for entry in state["versions"]:
            row = rows[entry["version"]]
            row.status = entry["status"]
            row.evaluation = _document(entry.get("evaluation"))
        head = session.get(AdapterRegistryRow, self.tenant_id)
        assert head is not None  # made by `_serialised`
        head.serving = state["serving"]
        head.history = list(state["history"])
        head.canary = dict(state["canary"]) if state["canary"] is not None else None
        head.pending = list(state["pending"])
        for entry in state["log"]:
            session.add(
                AdapterTransitionRow(
                    tenant_id=self.tenant_id,
                    at=_stamp(float(entry["at"])),
                    action=entry["action"],
                    version=entry["version"],
                    actor=entry["actor"],
                    reason=entry["reason"],
                    figures=_document(entry["figures"]),
                )
            )

    def _read(self) -> dict[str, Any]:
        self._adopt_file_registry()
        with self.storage.session() as session:
            return self._state_in(session)

    def _head(self) -> dict[str, Any]:
        """The serving state alone (one row: what each poll of `GET /v1/model` reads)."""
        self._adopt_file_registry()
        with self.storage.session() as session:
            head = session.get(AdapterRegistryRow, self.tenant_id)
        if head is None:
            return empty_state()
        return {
            "serving": head.serving,
            "history": list(head.history),
            "canary": dict(head.canary) if head.canary is not None else None,
            "pending": list(head.pending),
        }

    def transitions(self) -> list[dict[str, Any]]:
        self._adopt_file_registry()
        with self.storage.session() as session:
            return transitions_of(session, self.tenant_id)

    # -- the files --------------------------------------------------------------------------

    def files(self, version: int) -> dict[str, str]:
        """The SHA-256 of each file of `version` (its blobs' names), by file name."""
        with self.storage.session() as session:
            row = session.scalars(
                select(AdapterVersionRow).where(
                    AdapterVersionRow.tenant_id == self.tenant_id,
                    AdapterVersionRow.number == version,
                )
            ).first()
        if row is None:
            raise AdapterRegistryError(f"no adapter version {version} in {self._scope()}")
        return {str(name): str(checksum) for name, checksum in row.files.items()}

    def path(self, version: int) -> Path:
        """This instance's copy of `version`'s files, checked against their checksums (fetched
        from the blob store when missing or changed); `AdapterRegistryError` when a blob is
        missing or damaged."""
        self._adopt_file_registry()
        try:
            return self._local_copy(version, self.files(version))
        except BlobError as exc:
            raise AdapterRegistryError(f"{version_label(version)} cannot be read: {exc}") from None

    def _check_files(self, state: dict[str, Any], version: int, base_model: str) -> None:
        try:
            directory = self._local_copy(version, state["files"][version])
        except BlobError as exc:
            raise AdapterError(str(exc)) from None
        verify_adapter(directory, base_model)

    def _local_copy(self, version: int, files: dict[str, str]) -> Path:
        target = self.root / version_label(version)
        if _matches(target, files):
            return target
        work = self._work_dir(target)
        try:
            for name, checksum in files.items():
                self.blobs.fetch(checksum, work / name)
            self._install(work, target, files)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return target

    def _work_dir(self, target: Path) -> Path:
        work = self.root / f".{target.name}.{uuid.uuid4().hex}.tmp"
        work.mkdir(parents=True)
        return work

    def _install(self, work: Path, target: Path, files: dict[str, str]) -> None:
        """Put the complete copy `work` in place of `target`'s."""
        old = self.root / f".{target.name}.{uuid.uuid4().hex}.old"
        try:
            if target.exists():
                os.rename(target, old)
            try:
                os.rename(work, target)
            except OSError:  # another thread put a copy there meanwhile
                if not _matches(target, files):
                    raise
        finally:
            shutil.rmtree(old, ignore_errors=True)

    def add(self, adapter: Path, base_model: str, train: dict[str, Any]) -> AdapterVersion:
        """A new candidate version: `adapter`'s files (which must verify) stored as blobs, its
        manifest naming the version."""
        try:
            manifest = dict(verify_adapter(adapter, base_model))
        except AdapterError as exc:
            raise AdapterRegistryError(str(exc)) from None
        files = {name: self.blobs.put_file(adapter / name) for name in ADAPTER_FILES}
        for name, checksum in files.items():
            if checksum != manifest["files"][name]:
                raise AdapterRegistryError(f"adapter {name} changed while it was stored")
        self._adopt_file_registry()
        with self._serialised() as session:
            number = (
                session.scalar(
                    select(func.max(AdapterVersionRow.number)).where(
                        AdapterVersionRow.tenant_id == self.tenant_id
                    )
                )
                or 0
            ) + 1
            created = datetime.now(UTC).timestamp()
            record = AdapterVersion(number, created, base_model, "candidate", train)
            manifest["version"] = record.name
            data = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
            files[MANIFEST] = self.blobs.put_bytes(data)
            session.add(_version_row(self.tenant_id, asdict(record), files))
            session.commit()
        # This instance's copy, from the files at hand (no fetch back from the store).
        target = self.root / record.name
        work = self._work_dir(target)
        try:
            for name in ADAPTER_FILES:
                shutil.copyfile(adapter / name, work / name)
            (work / MANIFEST).write_bytes(data)
            self._install(work, target, files)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return record

    # -- a file registry from before ----------------------------------------------------------

    def _adopt_file_registry(self) -> None:
        """Copy the tenant's file registry under `root` into the database when the database has
        no registry of the tenant yet; a registry already there wins (the file is left)."""
        source = self.root / REGISTRY_FILE
        if not source.is_file():
            return
        with self.storage.session() as session:
            if session.get(AdapterRegistryRow, self.tenant_id) is not None:
                return
        old = AdapterRegistry(self.root)
        state = old._read()  # refused (AdapterRegistryError) when it is damaged
        files: dict[int, dict[str, str]] = {}
        for entry in state["versions"]:
            directory = self.root / version_label(int(entry["version"]))
            files[entry["version"]] = {
                name: self.blobs.put_file(directory / name) for name in (*ADAPTER_FILES, MANIFEST)
            }
        with self._serialised() as session:
            if self._rows(session):
                return  # another instance copied its own meanwhile
            for entry in state["versions"]:
                session.add(_version_row(self.tenant_id, entry, files[entry["version"]]))
            session.flush()
            self._store(session, state)
            session.commit()
        os.replace(source, source.with_name(REGISTRY_FILE + IMPORTED_SUFFIX))
        log.info(
            "tenant %s: %d adapter versions copied from the file registry into the database",
            self.tenant,
            len(state["versions"]),
        )


def _version_row(tenant_id: int, entry: dict[str, Any], files: dict[str, str]) -> AdapterVersionRow:
    return AdapterVersionRow(
        tenant_id=tenant_id,
        number=int(entry["version"]),
        created_at=_stamp(float(entry["created"])),
        base_model=entry["base_model"],
        status=entry["status"],
        train=json.dumps(entry.get("train") or {}, sort_keys=True),
        evaluation=_document(entry.get("evaluation")),
        files=files,
    )


def _matches(directory: Path, files: dict[str, str]) -> bool:
    """Whether `directory` holds every file with its checksum."""
    try:
        return all(file_sha256(directory / name) == checksum for name, checksum in files.items())
    except OSError:
        return False


@dataclass(frozen=True)
class TenantAdapters:
    """The adapter registries of one database's tenants: their files in one blob store, this
    instance's copies under its cache directory."""

    storage: Storage
    cache_dir: Path
    blobs: BlobStore

    @classmethod
    def open(cls, storage: Storage, cache_dir: Path, blob_url: str | None = None) -> TenantAdapters:
        """The registries of `storage`'s tenants, their blobs at `blob_url` (None: the
        default store under `cache_dir`)."""
        return cls(storage, cache_dir, BlobStore(blob_url or default_blob_url(cache_dir)))

    def registry(self, tenant: str, tenant_id: int | None = None) -> TenantAdapterRegistry:
        """Tenant `tenant`'s registry; ValueError for a tenant the database does not know, or
        a name that cannot name its local directory."""
        root = scope_dir(self.cache_dir, tenant=tenant)
        if tenant_id is None:
            tenant_id = self.storage.tenant_id(tenant)
            if tenant_id is None:
                raise ValueError(f"unknown tenant {tenant!r}")
        return TenantAdapterRegistry(self.storage, tenant_id, tenant, root, self.blobs)
