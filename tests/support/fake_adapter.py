"""An adapter directory whose files and manifest check out (`completion.adapters`), with weights
that are no model's: for tests of registries and serving, which check files but load none."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from completion.adapters import CONFIG, MANIFEST, WEIGHTS

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
