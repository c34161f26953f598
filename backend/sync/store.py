"""Storage of the index sync: keyed trees that the server re-hashes itself, and shared vectors.

Every method takes the authenticated tenant id and filters on it; there is no query that could
reach another tenant's rows. `apply` changes a tree and recomputes the hashes of every directory
it touched, bottom-up, in one transaction; when the client states the root it expects and the
recomputed root differs, the transaction is rolled back (`RootMismatch`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import delete, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from backend.storage import Storage
from backend.sync.models import SyncNode, SyncPlacement, SyncVector, SyncWorkspace
from indexer.merkle import EMPTY_ROOT, MerkleNode, directory_hash

EMPTY_ROOT_HEX = EMPTY_ROOT.hex()
BATCH = 500  # bound on parameters per IN (...) clause


@dataclass(frozen=True)
class FileUpsert:
    """A file's keyed path, keyed leaf hash (hex) and chunks `(chunk key, start, end)`."""

    path: str
    leaf: str
    chunks: Sequence[tuple[str, int, int]]


@dataclass(frozen=True)
class VectorBlob:
    """One vector as stored: raw little-endian bytes of `dtype`."""

    chunk: str
    dtype: str
    dimension: int
    data: bytes


class SyncError(ValueError):
    """A request that contradicts what is stored (answered with 409 or 422)."""


class RootMismatch(SyncError):
    """After applying the changes the tree's root is not the root the client claimed."""

    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"the recomputed root {actual} is not the claimed root {expected}")
        self.expected = expected
        self.actual = actual


class MissingVectors(SyncError):
    """Chunks were placed whose vectors the tenant's store does not hold."""

    def __init__(self, keys: Sequence[str]) -> None:
        shown = ", ".join(list(keys)[:5])
        super().__init__(f"{len(keys)} chunk keys have no vector (upload them first): {shown}")
        self.keys = list(keys)


def parent_of(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


def ancestors(path: str) -> Iterator[str]:
    """Every directory above `path`, nearest first, ending with the root ``""``."""
    while path:
        path = parent_of(path)
        yield path


def depth(path: str) -> int:
    return path.count("/") + 1 if path else 0


def _batches(items: Iterable[str]) -> Iterator[list[str]]:
    batch: list[str] = []
    for item in items:
        batch.append(item)
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


class IndexSyncStore:
    """The sync tables of one backend database."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._insert = postgresql.insert if storage.dialect == "postgresql" else sqlite.insert

    # -- reading -----------------------------------------------------------------------------

    def _workspace(
        self, session: Session, tenant_id: int, workspace: str, model: str
    ) -> int | None:
        return session.scalar(
            select(SyncWorkspace.id).where(
                SyncWorkspace.tenant_id == tenant_id,
                SyncWorkspace.workspace == workspace,
                SyncWorkspace.model == model,
            )
        )

    def root(self, tenant_id: int, workspace: str, model: str) -> str:
        """The workspace's root hash (hex); the empty tree's root when it was never synced."""
        with self.storage.sessions() as session:
            found = session.scalar(
                select(SyncWorkspace.root).where(
                    SyncWorkspace.tenant_id == tenant_id,
                    SyncWorkspace.workspace == workspace,
                    SyncWorkspace.model == model,
                )
            )
        return found or EMPTY_ROOT_HEX

    def children(
        self, tenant_id: int, workspace: str, model: str, dirs: Sequence[str]
    ) -> dict[str, list[tuple[str, str, bool]]]:
        """`{dir: [(keyed name, hash, is_dir)]}` for each directory (empty when unknown)."""
        found: dict[str, list[tuple[str, str, bool]]] = {d: [] for d in dirs}
        with self.storage.sessions() as session:
            ws = self._workspace(session, tenant_id, workspace, model)
            if ws is None:
                return found
            for batch in _batches(dict.fromkeys(dirs)):
                rows = session.execute(
                    select(SyncNode.parent, SyncNode.name, SyncNode.hash, SyncNode.is_dir).where(
                        SyncNode.tenant_id == tenant_id,
                        SyncNode.workspace_id == ws,
                        SyncNode.parent.in_(batch),
                        SyncNode.path != "",
                    )
                )
                for parent, name, digest, is_dir in rows:
                    found[parent].append((name, digest, bool(is_dir)))
        for listing in found.values():
            listing.sort()
        return found

    def placements(
        self, tenant_id: int, workspace: str, model: str, paths: Sequence[str]
    ) -> dict[str, list[tuple[str, int, int]]]:
        """The chunks placed in each file, in order (for audits and tests)."""
        found: dict[str, list[tuple[str, int, int]]] = {p: [] for p in paths}
        with self.storage.sessions() as session:
            ws = self._workspace(session, tenant_id, workspace, model)
            if ws is None:
                return found
            for batch in _batches(dict.fromkeys(paths)):
                rows = session.execute(
                    select(
                        SyncPlacement.path,
                        SyncPlacement.chunk,
                        SyncPlacement.start_line,
                        SyncPlacement.end_line,
                    )
                    .where(
                        SyncPlacement.tenant_id == tenant_id,
                        SyncPlacement.workspace_id == ws,
                        SyncPlacement.path.in_(batch),
                    )
                    .order_by(SyncPlacement.path, SyncPlacement.seq)
                )
                for path, chunk, start, end in rows:
                    found[path].append((chunk, start, end))
        return found

    def known(self, tenant_id: int, model: str, keys: Sequence[str]) -> list[str]:
        """The chunk keys among `keys` whose vectors the tenant holds for `model`."""
        with self.storage.sessions() as session:
            return sorted(self._known(session, tenant_id, model, keys))

    def _known(self, session: Session, tenant_id: int, model: str, keys: Iterable[str]) -> set[str]:
        found: set[str] = set()
        for batch in _batches(dict.fromkeys(keys)):
            found.update(
                session.scalars(
                    select(SyncVector.chunk).where(
                        SyncVector.tenant_id == tenant_id,
                        SyncVector.model == model,
                        SyncVector.chunk.in_(batch),
                    )
                )
            )
        return found

    def vectors(self, tenant_id: int, model: str, keys: Sequence[str]) -> list[VectorBlob]:
        """The tenant's vectors for those of `keys` it holds."""
        out: list[VectorBlob] = []
        with self.storage.sessions() as session:
            for batch in _batches(dict.fromkeys(keys)):
                rows = session.execute(
                    select(
                        SyncVector.chunk, SyncVector.dtype, SyncVector.dimension, SyncVector.vector
                    ).where(
                        SyncVector.tenant_id == tenant_id,
                        SyncVector.model == model,
                        SyncVector.chunk.in_(batch),
                    )
                )
                out.extend(VectorBlob(c, t, d, bytes(v)) for c, t, d, v in rows)
        return out

    # -- writing -----------------------------------------------------------------------------

    def apply(
        self,
        tenant_id: int,
        workspace: str,
        model: str,
        *,
        upserts: Sequence[FileUpsert] = (),
        removes: Sequence[str] = (),
        vectors: Sequence[VectorBlob] = (),
        expect_root: str | None = None,
    ) -> str:
        """Store vectors, place files, remove subtrees, re-hash; returns the new root (hex).

        Raises `MissingVectors` when a placed chunk has no vector, `SyncError` when the vectors
        do not fit the model's dimension, and `RootMismatch` (nothing is kept) when
        `expect_root` is given and the recomputed root differs.
        """
        now = datetime.now(UTC)
        with self.storage.sessions() as session, session.begin():
            ws = self._ensure_workspace(session, tenant_id, workspace, model, now)
            self._store_vectors(session, tenant_id, model, vectors, now)
            referenced = {chunk for u in upserts for chunk, _, _ in u.chunks}
            missing = referenced - self._known(session, tenant_id, model, referenced)
            if missing:
                raise MissingVectors(sorted(missing))
            touched: set[str] = set()
            for path in removes:
                self._delete_subtree(session, tenant_id, ws, path)
                touched.update(ancestors(path))
            if upserts:
                self._place_files(session, tenant_id, ws, upserts)
                for item in upserts:
                    touched.update(ancestors(item.path))
            root = self._rehash(session, tenant_id, ws, touched)
            if expect_root is not None and root != expect_root:
                raise RootMismatch(expect_root, root)  # leaving `begin()` rolls everything back
            session.execute(
                update(SyncWorkspace)
                .where(SyncWorkspace.id == ws, SyncWorkspace.tenant_id == tenant_id)
                .values(root=root, updated_at=now)
            )
        return root

    def _ensure_workspace(
        self, session: Session, tenant_id: int, workspace: str, model: str, now: datetime
    ) -> int:
        session.execute(
            self._insert(SyncWorkspace)
            .values(
                tenant_id=tenant_id,
                workspace=workspace,
                model=model,
                root=EMPTY_ROOT_HEX,
                updated_at=now,
            )
            .on_conflict_do_nothing(index_elements=["tenant_id", "workspace", "model"])
        )
        ws = self._workspace(session, tenant_id, workspace, model)
        assert ws is not None
        session.execute(
            self._insert(SyncNode)
            .values(
                workspace_id=ws,
                path="",
                tenant_id=tenant_id,
                parent="",
                name="",
                is_dir=True,
                hash=EMPTY_ROOT_HEX,
            )
            .on_conflict_do_nothing(index_elements=["workspace_id", "path"])
        )
        return ws

    def _store_vectors(
        self,
        session: Session,
        tenant_id: int,
        model: str,
        vectors: Sequence[VectorBlob],
        now: datetime,
    ) -> None:
        if not vectors:
            return
        dimensions = {v.dimension for v in vectors}
        stored = session.scalar(
            select(SyncVector.dimension)
            .where(SyncVector.tenant_id == tenant_id, SyncVector.model == model)
            .limit(1)
        )
        if stored is not None:
            dimensions.add(stored)
        if len(dimensions) > 1:
            raise SyncError(f"vectors of one model share one dimension, got {sorted(dimensions)}")
        rows = [
            {
                "tenant_id": tenant_id,
                "model": model,
                "chunk": v.chunk,
                "dtype": v.dtype,
                "dimension": v.dimension,
                "vector": v.data,
                "created_at": now,
            }
            for v in {v.chunk: v for v in vectors}.values()
        ]
        # Content-addressed: a key already stored keeps its vector.
        statement = self._insert(SyncVector).on_conflict_do_nothing(
            index_elements=["tenant_id", "model", "chunk"]
        )
        session.execute(statement, rows)

    def _delete_subtree(self, session: Session, tenant_id: int, ws: int, path: str) -> None:
        # Keyed paths are hex and `/` only, so LIKE has no wildcards to escape.
        for table in (SyncNode, SyncPlacement):
            session.execute(
                delete(table).where(
                    table.tenant_id == tenant_id,
                    table.workspace_id == ws,
                    or_(table.path == path, table.path.like(f"{path}/%")),
                )
            )

    def _place_files(
        self, session: Session, tenant_id: int, ws: int, upserts: Sequence[FileUpsert]
    ) -> None:
        paths = [u.path for u in upserts]
        above = {a for p in paths for a in ancestors(p) if a}
        # A directory that becomes a file loses its subtree; a file that becomes a directory
        # goes (it is one of the new files' ancestors).
        stale_dirs: list[str] = []
        stale_files: list[str] = []
        for batch in _batches([*paths, *above]):
            rows = session.execute(
                select(SyncNode.path, SyncNode.is_dir).where(
                    SyncNode.tenant_id == tenant_id,
                    SyncNode.workspace_id == ws,
                    SyncNode.path.in_(batch),
                )
            )
            for path, is_dir in rows:
                if is_dir and path not in above:
                    stale_dirs.append(path)
                elif not is_dir:
                    stale_files.append(path)
        for path in stale_dirs:
            self._delete_subtree(session, tenant_id, ws, path)
        for batch in _batches(stale_files):
            for table in (SyncNode, SyncPlacement):
                session.execute(
                    delete(table).where(
                        table.tenant_id == tenant_id,
                        table.workspace_id == ws,
                        table.path.in_(batch),
                    )
                )
        for batch in _batches(paths):  # placements of files whose node was a file already
            session.execute(
                delete(SyncPlacement).where(
                    SyncPlacement.tenant_id == tenant_id,
                    SyncPlacement.workspace_id == ws,
                    SyncPlacement.path.in_(batch),
                )
            )
        existing: set[str] = set()
        for batch in _batches(above):
            existing.update(
                session.scalars(
                    select(SyncNode.path).where(
                        SyncNode.tenant_id == tenant_id,
                        SyncNode.workspace_id == ws,
                        SyncNode.path.in_(batch),
                    )
                )
            )
        # New directories get a placeholder hash; `_rehash` sets the real one.
        nodes = [_node(ws, tenant_id, d, True, EMPTY_ROOT_HEX) for d in above - existing]
        nodes += [_node(ws, tenant_id, u.path, False, u.leaf) for u in upserts]
        session.execute(self._insert(SyncNode), nodes)
        placements = [
            {
                "workspace_id": ws,
                "path": u.path,
                "seq": seq,
                "tenant_id": tenant_id,
                "chunk": chunk,
                "start_line": start,
                "end_line": end,
            }
            for u in upserts
            for seq, (chunk, start, end) in enumerate(u.chunks)
        ]
        if placements:
            session.execute(self._insert(SyncPlacement), placements)

    def _rehash(self, session: Session, tenant_id: int, ws: int, touched: set[str]) -> str:
        """Recompute the touched directories, deepest first; empty ones (but the root) go."""
        touched.add("")
        levels: dict[int, list[str]] = defaultdict(list)
        for path in touched:
            levels[depth(path)].append(path)
        root = EMPTY_ROOT_HEX
        for level in sorted(levels, reverse=True):
            children: dict[str, dict[str, MerkleNode]] = {d: {} for d in levels[level]}
            for batch in _batches(levels[level]):
                rows = session.execute(
                    select(SyncNode.parent, SyncNode.name, SyncNode.hash).where(
                        SyncNode.tenant_id == tenant_id,
                        SyncNode.workspace_id == ws,
                        SyncNode.parent.in_(batch),
                        SyncNode.path != "",
                    )
                )
                for parent, name, digest in rows:
                    children[parent][name] = MerkleNode(name, bytes.fromhex(digest))
            empty = [d for d, kids in children.items() if not kids and d]
            for batch in _batches(empty):
                session.execute(
                    delete(SyncNode).where(
                        SyncNode.tenant_id == tenant_id,
                        SyncNode.workspace_id == ws,
                        SyncNode.path.in_(batch),
                    )
                )
            for path, kids in children.items():
                if not kids and path:
                    continue
                digest = directory_hash(kids).hex()
                session.execute(
                    update(SyncNode)
                    .where(
                        SyncNode.tenant_id == tenant_id,
                        SyncNode.workspace_id == ws,
                        SyncNode.path == path,
                    )
                    .values(hash=digest)
                )
                if not path:
                    root = digest
        return root


def _node(ws: int, tenant_id: int, path: str, is_dir: bool, digest: str) -> dict[str, object]:
    return {
        "workspace_id": ws,
        "path": path,
        "tenant_id": tenant_id,
        "parent": parent_of(path),
        "name": path.rsplit("/", 1)[-1],
        "is_dir": is_dir,
        "hash": digest,
    }
