"""Ways to damage a saved adapter directory, for the tests that it is refused."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from completion.adapters import MANIFEST, WEIGHTS


def flip_byte(directory: Path) -> None:
    """One byte of the weights changed: the checksum in the manifest no longer matches."""
    path = directory / WEIGHTS
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def wrong_checksum(directory: Path) -> None:
    """The manifest names a checksum that is not the file's."""
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["files"][WEIGHTS] = hashlib.sha256(b"another file").hexdigest()
    (directory / MANIFEST).write_text(json.dumps(manifest))


def wrong_shape(directory: Path) -> None:
    """Checksums re-made by hand: the manifest agrees, the tensors do not fit the model."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(directory / WEIGHTS))
    tensors[next(iter(tensors))] = torch.zeros(3, 3)
    save_file(tensors, str(directory / WEIGHTS))
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["files"][WEIGHTS] = hashlib.sha256((directory / WEIGHTS).read_bytes()).hexdigest()
    (directory / MANIFEST).write_text(json.dumps(manifest))


def other_base(directory: Path) -> None:
    """The adapter says it was trained on another base model."""
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["base_model"] = "another@model"
    (directory / MANIFEST).write_text(json.dumps(manifest))
