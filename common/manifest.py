"""A directory written once and checked before every use: the size and SHA-256 of each of its files
in a manifest beside them.

A converted model (the fast engines' copies, the index's ONNX embedder) is written into a
temporary directory, given its manifest (`write_manifest`) and renamed into place; `verify` tells
whether what is there now is what was written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MANIFEST = "tabloop-manifest.json"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(target: Path) -> dict[str, Any] | None:
    try:
        loaded = json.loads((target / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return loaded if isinstance(loaded, dict) else None


def verify(target: Path) -> str | None:
    """Why the converted copy in `target` must not be loaded, or None when it is whole."""
    manifest = read_manifest(target)
    if manifest is None:
        return "no manifest (never finished converting)"
    files = manifest.get("files")
    weights = str(manifest.get("weights", "model.bin"))
    if not isinstance(files, dict) or weights not in files:
        return f"manifest lists no {weights}"
    for name, expected in files.items():
        path = target / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != expected.get("size"):
            return f"{name} has {size} bytes, the manifest says {expected.get('size')}"
        if file_sha256(path) != expected.get("sha256"):
            return f"{name} does not match its checksum"
    return None


def write_manifest(work: Path, record: dict[str, Any]) -> None:
    """Write `record` with every file of `work` (size, SHA-256) as its manifest. `record` names
    the file `verify` must find (`weights`)."""
    files = {
        item.name: {"size": item.stat().st_size, "sha256": file_sha256(item)}
        for item in sorted(work.iterdir())
        if item.is_file() and item.name != MANIFEST
    }
    (work / MANIFEST).write_text(json.dumps({**record, "files": files}, indent=1), encoding="utf-8")


def reuse_or_clear(target: Path, what: str, layout: int = 1) -> bool:
    """Whether the directory `target` can be used as it is (`verify`, and its manifest's
    `layout`, 1 when it has none, is `layout`); call it holding the lock that guards `target`.
    When it cannot, the copy is deleted (with a warning naming `what` when it is damaged), and
    so are the temporary directories a killed build left beside it (`.<name>.*`)."""
    if target.exists():
        problem = verify(target)
        made = (read_manifest(target) or {}).get("layout", 1)
        if problem is None and made == layout:
            return True
        if problem is None:
            log.info("%s %s has layout %s, not %s: making it again", what, target, made, layout)
        else:
            log.warning("%s %s is damaged (%s): making it again", what, target, problem)
        shutil.rmtree(target, ignore_errors=True)
    for stale in target.parent.glob(f".{target.name}.*"):
        shutil.rmtree(stale, ignore_errors=True)
    return False
