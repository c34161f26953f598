"""An adapter directory whose files and manifest check out (`completion.adapters`), with weights
that are no model's: for tests of registries and serving, which check files but load none; and
damage to a stored version's blob, for the tests that it is refused."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from completion.adapters import CONFIG, MANIFEST, WEIGHTS

if TYPE_CHECKING:
    from backend.adapters.registry import TenantAdapterRegistry

FAKE_BASE_MODEL = "base@1"


def fake_adapter(directory: Path, fill: int = 0, size: int = 4096) -> Path:
    """Write an adapter for `FAKE_BASE_MODEL` into `directory` (weights: `size` bytes of
    `fill`, so adapters of different fills differ); returns it."""
    directory.mkdir(parents=True)
    (directory / CONFIG).write_text('{"r": 2}\n')
    (directory / WEIGHTS).write_bytes(bytes([fill]) * size)
    files = {
        name: hashlib.sha256((directory / name).read_bytes()).hexdigest()
        for name in (CONFIG, WEIGHTS)
    }
    (directory / MANIFEST).write_text(json.dumps({"base_model": FAKE_BASE_MODEL, "files": files}))
    return directory


def blob_path(registry: TenantAdapterRegistry, version: int, name: str) -> Path:
    """The blob of file `name` of a tenant's `version`, in a blob store that is a directory."""
    return Path(registry.blobs.location(registry.files(version)[name]))


def damage_blob(registry: TenantAdapterRegistry, version: int, name: str = WEIGHTS) -> None:
    """Flip one byte of the blob of file `name` of `version` in the registry's blob store."""
    store = registry.blobs
    location = store.location(registry.files(version)[name])
    data = bytearray(store.fs.cat_file(location))
    data[len(data) // 2] ^= 0x01
    store.fs.pipe_file(location, bytes(data))
