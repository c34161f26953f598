"""The persistent index of one workspace: metadata in SQLite, vectors in FAISS.

Layout of the index directory (`index_dir(cache_dir, root)`):

- `meta.sqlite3`: files (the stat cache and Merkle leaves), directory listings, chunk
  placements (path, line range, language, symbols), chunk contents (text and vector by chunk id),
  symbols, and `meta` (schema, model, a change counter, the FAISS snapshot's name and checksum);
- `vectors-<version>.faiss`: a snapshot of the FAISS index, written with `atomic_write`;
- `writer.lock`: the single-writer lock.

SQLite is the source of truth and commits each batch atomically, so a killed process leaves the
old state or the new one. The FAISS snapshot is an accelerator: on load it must match its
checksum, the change counter and the number of chunk rows, or it is rebuilt from the vectors in
SQLite (a checksum mismatch also moves the file aside as `*.corrupt`). A database SQLite calls
corrupt is moved aside and the index starts empty.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from indexer.atomic_files import atomic_write, fsync_dir, quarantine, remove_stale_temps
from indexer.scan import DirListing, FileStat, StatCache
from indexer.types import Chunk, SearchHit, Symbol, SymbolHit
from indexer.vectors import VectorIndex, checksum

log = logging.getLogger(__name__)

SCHEMA_VERSION = "1"
PREVIEW_LINES = 8

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files (
    path TEXT PRIMARY KEY, digest BLOB, mtime_ns INTEGER NOT NULL, size INTEGER NOT NULL,
    ino INTEGER NOT NULL, skip TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS dirs (path TEXT PRIMARY KEY, listing TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS contents (chunk TEXT PRIMARY KEY, text TEXT NOT NULL,
    vector BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY, path TEXT NOT NULL, start_line INTEGER NOT NULL,
    end_line INTEGER NOT NULL, language TEXT NOT NULL, chunk TEXT NOT NULL, symbols TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS chunks_by_path ON chunks (path, start_line);
CREATE INDEX IF NOT EXISTS chunks_by_chunk ON chunks (chunk);
CREATE TABLE IF NOT EXISTS symbols (
    name TEXT NOT NULL, kind TEXT NOT NULL, path TEXT NOT NULL, line INTEGER NOT NULL,
    container TEXT NOT NULL, row INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS symbols_by_name ON symbols (name COLLATE NOCASE);
CREATE INDEX IF NOT EXISTS symbols_by_row ON symbols (row);
"""


class CorruptIndex(Exception):
    """The index on disk cannot be used as it is."""


def index_dir(cache_dir: Path, root: Path) -> Path:
    """The directory of `root`'s index inside `cache_dir`, keyed by a hash of the path."""
    key = hashlib.sha256(str(root.resolve()).encode("utf-8")).hexdigest()[:20]
    return cache_dir / "index" / key


@dataclass
class FileUpdate:
    """A file's new state: its stat record and, when indexed, its chunks and their vectors."""

    path: str
    stat: FileStat
    chunks: Sequence[Chunk] = ()
    vectors: dict[str, np.ndarray] | None = None


class IndexStore:
    """Metadata and vectors of one workspace's index. Thread-safe."""

    def __init__(
        self,
        directory: Path,
        *,
        dimension: int,
        model_id: str,
        hnsw_threshold: int = 0,
        readonly: bool = False,
    ) -> None:
        self.directory = directory
        self.dimension = dimension
        self.model_id = model_id
        self.hnsw_threshold = hnsw_threshold
        self.readonly = readonly
        self.recovered: list[str] = []  # what was repaired on open, for status and logs
        self._lock = threading.RLock()
        self._dirty = False
        directory.mkdir(parents=True, exist_ok=True)
        if not readonly:
            remove_stale_temps(directory)
        self.db = self._open_db()
        self.vectors = self._load_vectors()

    # -- opening -----------------------------------------------------------------------------

    @property
    def db_path(self) -> Path:
        return self.directory / "meta.sqlite3"

    def _connect(self) -> sqlite3.Connection:
        if self.readonly:
            uri = f"file:{self.db_path}?mode=ro"
            return sqlite3.connect(uri, uri=True, check_same_thread=False, timeout=30)
        db = sqlite3.connect(self.db_path, check_same_thread=False, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        return db

    def _open_db(self) -> sqlite3.Connection:
        for attempt in range(2):
            db: sqlite3.Connection | None = None
            try:
                db = self._connect()
                if (db.execute("PRAGMA quick_check").fetchone() or ("",))[0] != "ok":
                    raise sqlite3.DatabaseError("quick_check failed")
                if not self.readonly:
                    db.executescript(_SCHEMA)
                    self._check_meta(db)
                return db
            except (sqlite3.DatabaseError, CorruptIndex) as exc:
                if db is not None:
                    db.close()
                if attempt or self.readonly:
                    raise CorruptIndex(f"{self.db_path}: {exc}") from exc
                log.warning("index database %s is unusable (%s); rebuilding", self.db_path, exc)
                self.recovered.append(f"database: {exc}")
                if self.db_path.exists():
                    quarantine(self.db_path)
                for snapshot in self.directory.glob("vectors-*.faiss"):
                    snapshot.unlink()
        raise AssertionError("unreachable")

    def _check_meta(self, db: sqlite3.Connection) -> None:
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        expected = {"schema": SCHEMA_VERSION, "model": self.model_id}
        if not meta:
            with db:
                db.executemany(
                    "INSERT INTO meta VALUES (?, ?)", [*expected.items(), ("version", "0")]
                )
            return
        for key, value in expected.items():
            if meta.get(key) != value:
                # Another schema or embedding model: the vectors are useless, start over.
                raise CorruptIndex(f"{key} is {meta.get(key)!r}, expected {value!r}")

    def _meta(self, key: str, default: str = "") -> str:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else default

    def _set_meta(self, values: dict[str, str]) -> None:
        self.db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", list(values.items()))

    def _load_vectors(self) -> VectorIndex:
        name = self._meta("faiss_file")
        rows = self.db.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
        if name:
            path = self.directory / name
            try:
                data = path.read_bytes()
                if checksum(data) != self._meta("faiss_sha256"):
                    if not self.readonly:
                        quarantine(path)
                    raise CorruptIndex(f"{name}: checksum mismatch")
                dead = json.loads(self._meta("faiss_dead", "[]"))
                loaded = VectorIndex.deserialize(data, self.dimension, self.hnsw_threshold, dead)
                if self._meta("faiss_version") == self._meta("version") and loaded.live == rows:
                    return loaded
                log.info("vector snapshot is behind the metadata; rebuilding it from SQLite")
            except (OSError, ValueError, CorruptIndex) as exc:
                log.warning("vector snapshot unusable (%s); rebuilding it from SQLite", exc)
                self.recovered.append(f"vectors: {exc}")
        return self._rebuild_vectors()

    def _rebuild_vectors(self) -> VectorIndex:
        index = VectorIndex(self.dimension, self.hnsw_threshold)
        cursor = self.db.execute(
            "SELECT chunks.id, contents.vector FROM chunks JOIN contents USING (chunk)"
        )
        while batch := cursor.fetchmany(4096):
            ids = np.fromiter((row[0] for row in batch), np.int64, len(batch))
            vectors = np.frombuffer(b"".join(row[1] for row in batch), np.float32)
            index.add(ids, vectors.reshape(len(batch), self.dimension))
        self._dirty = True
        return index

    # -- the stat cache and the Merkle leaves ------------------------------------------------

    def stat_cache(self) -> StatCache:
        """The stat cache as of the last committed batch."""
        with self._lock:
            cache = StatCache(fingerprint=self._meta("scan_fingerprint"))
            for path, digest, mtime, size, ino, skip in self.db.execute("SELECT * FROM files"):
                cache.files[path] = FileStat(mtime, size, ino, digest, skip)
            for path, listing in self.db.execute("SELECT path, listing FROM dirs"):
                mtime, files, dirs, ignore_files, keys = json.loads(listing)
                ignore = {name: (k[0], k[1]) for name, k in ignore_files.items()}
                stats = None if keys is None else [(k[0], k[1], k[2]) for k in keys]
                cache.dirs[path] = DirListing(mtime, files, dirs, ignore, stats)
            return cache

    def save_listings(self, cache: StatCache, changed_dirs: Iterable[str]) -> None:
        """Persist directory listings (all of them when the set of directories changed)."""
        with self._lock, self.db:
            known = {row[0] for row in self.db.execute("SELECT path FROM dirs")}
            gone = known - cache.dirs.keys()
            self.db.executemany("DELETE FROM dirs WHERE path = ?", [(p,) for p in gone])
            rows = []
            for path in changed_dirs:
                listing = cache.dirs.get(path)
                if listing is not None:
                    encoded = [
                        listing.mtime_ns,
                        listing.files,
                        listing.dirs,
                        listing.ignore_files,
                        listing.keys,
                    ]
                    rows.append((path, json.dumps(encoded)))
            self.db.executemany("INSERT OR REPLACE INTO dirs VALUES (?, ?)", rows)
            self._set_meta({"scan_fingerprint": cache.fingerprint})

    def leaves(self) -> dict[str, bytes]:
        """{path: Merkle leaf hash} of every indexed file."""
        with self._lock:
            rows = self.db.execute("SELECT path, digest FROM files WHERE digest IS NOT NULL")
            return {path: bytes(digest) for path, digest in rows}

    # -- writing -----------------------------------------------------------------------------

    def known_vectors(self, chunk_ids: Sequence[str]) -> dict[str, np.ndarray]:
        """Vectors this index already holds for some of `chunk_ids`."""
        found: dict[str, np.ndarray] = {}
        with self._lock:
            for start in range(0, len(chunk_ids), 500):
                batch = list(chunk_ids[start : start + 500])
                marks = ",".join("?" * len(batch))
                query = f"SELECT chunk, vector FROM contents WHERE chunk IN ({marks})"
                for chunk, blob in self.db.execute(query, batch):
                    found[chunk] = np.frombuffer(blob, dtype=np.float32)
        return found

    def update_stats(self, stats: dict[str, FileStat]) -> None:
        """Record new stat data of files whose content did not change."""
        with self._lock, self.db:
            self.db.executemany(
                "UPDATE files SET mtime_ns = ?, size = ?, ino = ? WHERE path = ?",
                [(s.mtime_ns, s.size, s.ino, path) for path, s in stats.items()],
            )

    def apply(
        self, updates: Sequence[FileUpdate], removed: Sequence[str], root_hash: bytes | None = None
    ) -> None:
        """Replace the chunks of updated files and drop removed ones, in one transaction."""
        if self.readonly:
            raise PermissionError("this index is open read-only")
        with self._lock:
            old_ids: list[int] = []
            new_ids: list[int] = []
            new_vectors: list[np.ndarray] = []
            with self.db:
                for path in [*removed, *(u.path for u in updates)]:
                    rows = self.db.execute("SELECT id FROM chunks WHERE path = ?", (path,))
                    ids = [row[0] for row in rows]
                    old_ids.extend(ids)
                    self.db.execute("DELETE FROM chunks WHERE path = ?", (path,))
                    self.db.execute("DELETE FROM symbols WHERE path = ?", (path,))
                self.db.executemany("DELETE FROM files WHERE path = ?", [(p,) for p in removed])
                for update in updates:
                    self._write_file(update, new_ids, new_vectors)
                version = int(self._meta("version", "0")) + 1
                values = {"version": str(version)}
                if root_hash is not None:
                    values["merkle_root"] = root_hash.hex()
                self._set_meta(values)
            self.vectors.remove(old_ids)
            if new_ids:
                self.vectors.add(np.asarray(new_ids, np.int64), np.stack(new_vectors))
            self._dirty = True

    def _write_file(
        self, update: FileUpdate, new_ids: list[int], new_vectors: list[np.ndarray]
    ) -> None:
        st = update.stat
        self.db.execute(
            "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?)",
            (update.path, st.digest, st.mtime_ns, st.size, st.ino, st.skip),
        )
        vectors = update.vectors or {}
        for chunk in update.chunks:
            vector = vectors[chunk.id]
            self.db.execute(
                "INSERT OR IGNORE INTO contents VALUES (?, ?, ?)",
                (chunk.id, chunk.text, np.asarray(vector, np.float32).tobytes()),
            )
            symbols = json.dumps([[s.name, s.kind, s.line, s.container] for s in chunk.symbols])
            cursor = self.db.execute(
                "INSERT INTO chunks (path, start_line, end_line, language, chunk, symbols)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (chunk.path, chunk.start_line, chunk.end_line, chunk.language, chunk.id, symbols),
            )
            row = int(cursor.lastrowid or 0)
            new_ids.append(row)
            new_vectors.append(vector)
            self.db.executemany(
                "INSERT INTO symbols VALUES (?, ?, ?, ?, ?, ?)",
                [(s.name, s.kind, chunk.path, s.line, s.container, row) for s in chunk.symbols],
            )

    def save(self) -> bool:
        """Snapshot the vectors if they changed since the last snapshot; True when written."""
        if self.readonly:
            return False
        with self._lock:
            if not self._dirty:
                return False
            with self.db:  # contents nothing points at any more
                self.db.execute(
                    "DELETE FROM contents WHERE chunk NOT IN (SELECT chunk FROM chunks)"
                )
            version = self._meta("version", "0")
            name = f"vectors-{version}.faiss"
            data = self.vectors.serialize()
            atomic_write(self.directory / name, data)
            with self.db:
                self._set_meta(
                    {
                        "faiss_file": name,
                        "faiss_sha256": checksum(data),
                        "faiss_version": version,
                        "faiss_dead": json.dumps(sorted(self.vectors.dead)),
                    }
                )
            for old in self.directory.glob("vectors-*.faiss"):
                if old.name != name:
                    old.unlink(missing_ok=True)
            fsync_dir(self.directory)
            self._dirty = False
            return True

    # -- reading -----------------------------------------------------------------------------

    def counts(self) -> tuple[int, int]:
        """(indexed files, chunks)."""
        with self._lock:
            files = self.db.execute("SELECT COUNT(*) FROM files WHERE digest IS NOT NULL")
            chunks = self.db.execute("SELECT COUNT(*) FROM chunks")
            return files.fetchone()[0], chunks.fetchone()[0]

    def search(self, query: np.ndarray, k: int, path_prefix: str = "") -> list[SearchHit]:
        """The `k` chunks closest to a query vector, optionally under `path_prefix`."""
        with self._lock:
            fetch = k if not path_prefix else max(k * 8, 64)
            hits = self.vectors.search(query, fetch)
            rows = self._chunk_rows([row for row, _ in hits])
            out: list[SearchHit] = []
            for row, score in hits:
                found = rows.get(row)
                if found is None or not found[0].startswith(path_prefix):
                    continue
                out.append(_hit(found, score))
                if len(out) == k:
                    break
            return out

    def _chunk_rows(
        self, ids: Sequence[int]
    ) -> dict[int, tuple[str, int, int, str, str, str, str]]:
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        query = (
            "SELECT chunks.id, path, start_line, end_line, language, chunk, symbols, text"
            f" FROM chunks JOIN contents USING (chunk) WHERE chunks.id IN ({marks})"
        )
        return {row[0]: row[1:] for row in self.db.execute(query, list(ids))}

    def chunks_of(self, path: str) -> list[Chunk]:
        """The chunks of one file in line order."""
        with self._lock:
            rows = self.db.execute(
                "SELECT path, start_line, end_line, language, text, symbols, chunk FROM chunks"
                " JOIN contents USING (chunk) WHERE path = ? ORDER BY start_line, chunks.id",
                (path,),
            ).fetchall()
        return [_chunk(row) for row in rows]

    def chunk_at(self, path: str, line: int) -> Chunk | None:
        """The chunk of `path` that holds 0-based `line`, or None."""
        with self._lock:
            row = self.db.execute(
                "SELECT path, start_line, end_line, language, text, symbols, chunk FROM chunks"
                " JOIN contents USING (chunk) WHERE path = ? AND start_line <= ? AND end_line > ?"
                " ORDER BY start_line DESC LIMIT 1",
                (path, line, line),
            ).fetchone()
        return _chunk(row) if row else None

    def symbols_named(self, query: str, k: int) -> list[SymbolHit]:
        """Symbols whose name equals, starts with, or contains `query` (case-insensitive)."""
        if not query:
            return []
        pattern = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        with self._lock:
            rows = self.db.execute(
                "SELECT name, kind, path, line, container FROM symbols"
                " WHERE name LIKE ? ESCAPE '\\' LIMIT ?",
                (pattern, max(k * 20, 200)),
            ).fetchall()
        lowered = query.lower()

        def rank(row: tuple[str, str, str, int, str]) -> tuple[int, int, str]:
            name = row[0].lower()
            tier = 0 if name == lowered else 1 if name.startswith(lowered) else 2
            return (tier, len(name), row[2])

        rows.sort(key=rank)
        return [
            SymbolHit(
                name,
                kind,
                path,
                line,
                container,
                1.0 - rank((name, kind, path, line, container))[0] / 4,
            )
            for name, kind, path, line, container in rows[:k]
        ]

    def chunk_symbols(self, path: str, start_line: int, end_line: int) -> list[Symbol]:
        """Symbols defined in lines [start_line, end_line) of `path`."""
        with self._lock:
            rows = self.db.execute(
                "SELECT name, kind, line, container FROM symbols"
                " WHERE path = ? AND line >= ? AND line < ? ORDER BY line",
                (path, start_line, end_line),
            ).fetchall()
        return [Symbol(name, kind, line, container) for name, kind, line, container in rows]

    def close(self) -> None:
        with self._lock, contextlib.suppress(sqlite3.Error):
            self.db.close()


def _chunk(row: tuple[str, int, int, str, str, str, str]) -> Chunk:
    path, start, end, language, text, symbols, chunk = row
    parsed = tuple(Symbol(n, kind, line, c) for n, kind, line, c in json.loads(symbols))
    return Chunk(path, start, end, language, text, parsed, chunk)


def _hit(row: tuple[str, int, int, str, str, str, str], score: float) -> SearchHit:
    path, start, end, language, chunk, symbols, text = row
    names = tuple(
        Symbol(n, kind, line, c).qualified_name for n, kind, line, c in json.loads(symbols)
    )
    preview = "".join(text.splitlines(keepends=True)[:PREVIEW_LINES])
    return SearchHit(path, start, end, score, preview, names, chunk, language, text)
