"""Adapters for tests: one that changes what the tiny model writes, and ways to damage a saved
adapter directory, for the tests that it is refused."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from completion.adapters import MANIFEST, WEIGHTS


def strong_adapter(
    source: Any, base_model_id: str, cache: Path, target: Path, meta: dict[str, Any] | None = None
) -> Path:
    """Save at `target` an adapter with large LoRA B weights (fixed seed) on the model of
    `source`: it changes what the model writes."""
    import torch

    from completion.adapters import save_adapter
    from completion.runners.loading import load_model
    from training.lora import LoraShape, attach_lora

    _tokenizer, model = load_model(source, "float32", cache)
    wrapped = attach_lora(model, LoraShape(rank=2, alpha=4, dropout=0.0))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    save_adapter(wrapped, target, base_model_id, meta or {})
    return target


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


def rewrite_config(directory: Path, changes: dict[str, Any]) -> None:
    """The adapter's config with `changes`, its checksum in the manifest re-made to match."""
    from completion.adapters import CONFIG

    config = json.loads((directory / CONFIG).read_text())
    (directory / CONFIG).write_text(json.dumps({**config, **changes}))
    manifest = json.loads((directory / MANIFEST).read_text())
    manifest["files"][CONFIG] = hashlib.sha256((directory / CONFIG).read_bytes()).hexdigest()
    (directory / MANIFEST).write_text(json.dumps(manifest))
