"""The adapter files of the tenants, as blobs named by their SHA-256, in any fsspec store.

A blob's name is the checksum of its bytes (`sha256/ab/ab12…`), so a file stored twice is one
blob, and every read can be checked: `fetch` copies a blob to a local file while hashing it and
refuses it (`BlobError`, naming the blob, never a path or URL of the store) when the bytes do
not hash to its name; nothing of a damaged blob reaches the destination. A write goes to a
temporary name in the store first and is moved to its name when complete, so a reader sees a
whole blob or none (on an object store the move is a copy then a delete: the object under the
final name is still written whole).

The store is a local directory by default (`<cache>/adapter-blobs`, `default_blob_url`), or any
URL fsspec opens (`s3://bucket/prefix`, `gs://…`, `memory://…`), set by `adapters.blob_url`:
backend instances on several machines share one store and keep their own verified copies
(`backend.adapters.registry`).
"""

from __future__ import annotations

import hashlib
import os
import re
import uuid
from pathlib import Path
from typing import Any

import fsspec

CHUNK = 1 << 20
BLOB_DIR = "adapter-blobs"
_CHECKSUM = re.compile(r"[0-9a-f]{64}")


class BlobError(Exception):
    """A blob that is missing or damaged (its bytes do not hash to its name); the message names
    the blob, not where the store is."""


def default_blob_url(cache_dir: Path) -> str:
    """Where a backend keeps adapter blobs when no store is set: a directory of its cache."""
    return str(cache_dir / BLOB_DIR)


class BlobStore:
    """Content-addressed blobs under one fsspec URL."""

    def __init__(self, url: str) -> None:
        self.url = url
        fs, root = fsspec.core.url_to_fs(url)
        self.fs: Any = fs
        self.root = str(root).rstrip("/")

    def location(self, checksum: str) -> str:
        """Where blob `checksum` is in the store (a path of `fs`)."""
        if not _CHECKSUM.fullmatch(checksum):
            raise BlobError(f"not a blob name: {checksum!r}")
        return f"{self.root}/sha256/{checksum[:2]}/{checksum}"

    def put_file(self, path: Path) -> str:
        """Store the local file `path`; returns its checksum (the blob's name), computed from
        the bytes that were stored."""
        digest = hashlib.sha256()
        temporary = f"{self.root}/tmp/{uuid.uuid4().hex}"
        self.fs.makedirs(f"{self.root}/tmp", exist_ok=True)
        try:
            with path.open("rb") as source, self.fs.open(temporary, "wb") as target:
                while chunk := source.read(CHUNK):
                    digest.update(chunk)
                    target.write(chunk)
            checksum = digest.hexdigest()
            self._commit(temporary, checksum)
        except BaseException:
            self._discard(temporary)
            raise
        return checksum

    def put_bytes(self, data: bytes) -> str:
        """Store `data`; returns its checksum."""
        checksum = hashlib.sha256(data).hexdigest()
        temporary = f"{self.root}/tmp/{uuid.uuid4().hex}"
        self.fs.makedirs(f"{self.root}/tmp", exist_ok=True)
        try:
            self.fs.pipe_file(temporary, data)
            self._commit(temporary, checksum)
        except BaseException:
            self._discard(temporary)
            raise
        return checksum

    def _commit(self, temporary: str, checksum: str) -> None:
        name = self.location(checksum)
        self.fs.makedirs(name.rsplit("/", 1)[0], exist_ok=True)
        self.fs.mv(temporary, name)

    def _discard(self, temporary: str) -> None:
        try:
            if self.fs.exists(temporary):
                self.fs.rm(temporary)
        except OSError:
            pass  # a leftover temporary file is named by no version

    def fetch(self, checksum: str, target: Path) -> None:
        """Copy blob `checksum` to the local file `target`, checked on the way: `BlobError` when
        it is missing or its bytes do not hash to its name (then `target` is left as it was)."""
        name = self.location(checksum)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        digest = hashlib.sha256()
        try:
            try:
                source = self.fs.open(name, "rb")
            except FileNotFoundError:
                raise BlobError(f"blob {checksum} is missing from the adapter store") from None
            with source, temporary.open("wb") as handle:
                while chunk := source.read(CHUNK):
                    digest.update(chunk)
                    handle.write(chunk)
            if digest.hexdigest() != checksum:
                raise BlobError(
                    f"blob {checksum} is damaged: its bytes hash to {digest.hexdigest()}"
                )
            os.replace(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)

    def read(self, checksum: str) -> bytes:
        """The bytes of blob `checksum`, checked (`BlobError` as for `fetch`)."""
        try:
            data: bytes = self.fs.cat_file(self.location(checksum))
        except FileNotFoundError:
            raise BlobError(f"blob {checksum} is missing from the adapter store") from None
        if hashlib.sha256(data).hexdigest() != checksum:
            raise BlobError(
                f"blob {checksum} is damaged: its bytes hash to {hashlib.sha256(data).hexdigest()}"
            )
        return data
