"""LoRA adapters on the completion model (peft): the format on disk, checks, loading, removal.

An adapter on disk is a directory with peft's `adapter_config.json` and
`adapter_model.safetensors`, plus our `manifest.json`: the SHA-256 of both files and the identity
of the base model it was trained on. Nothing is loaded into a model before the manifest, the
checksums, the tensors and their shapes all check out, so a corrupt or foreign adapter is refused
and whatever was serving keeps serving.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from common.manifest import file_sha256

MANIFEST = "manifest.json"
WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"


class AdapterError(ValueError):
    """An adapter that cannot be used: missing, corrupt, or made for another base model."""


def save_adapter(peft_model: Any, target: Path, base_model_id: str, meta: dict[str, Any]) -> None:
    """Write the adapter of `peft_model` to `target` atomically (a new directory, renamed)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        peft_model.save_pretrained(str(work), safe_serialization=True)
        manifest = {
            "base_model": base_model_id,
            "files": {name: file_sha256(work / name) for name in (CONFIG, WEIGHTS)},
            **meta,
        }
        (work / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        for name in (CONFIG, WEIGHTS, MANIFEST):
            with (work / name).open("rb") as handle:
                os.fsync(handle.fileno())
        if target.exists():
            shutil.rmtree(target)
        os.rename(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def read_manifest(directory: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"adapter {directory}: no readable {MANIFEST} ({exc})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise AdapterError(f"adapter {directory}: {MANIFEST} is not an adapter manifest")
    return manifest


def verify_adapter(directory: Path, base_model_id: str | None = None) -> dict[str, Any]:
    """The adapter's manifest once its files match their checksums (and, given `base_model_id`,
    it was trained on that model); otherwise `AdapterError`."""
    manifest = read_manifest(directory)
    for name in (CONFIG, WEIGHTS):
        expected = manifest["files"].get(name)
        path = directory / name
        if not path.is_file():
            raise AdapterError(f"adapter {directory}: {name} is missing")
        if expected != file_sha256(path):
            raise AdapterError(f"adapter {directory}: {name} does not match its checksum")
    if base_model_id is not None and manifest.get("base_model") != base_model_id:
        raise AdapterError(
            f"adapter {directory} was trained on {manifest.get('base_model')}, "
            f"not on the loaded model {base_model_id}"
        )
    return manifest


def load_adapter_tensors(directory: Path, base_model_id: str | None = None) -> dict[str, Any]:
    """The verified adapter's tensors, read into memory (nothing touches a model yet)."""
    from safetensors.torch import load_file

    verify_adapter(directory, base_model_id)
    try:
        return dict(load_file(str(directory / WEIGHTS)))
    except Exception as exc:  # safetensors raises its own error types for a damaged file
        raise AdapterError(f"adapter {directory}: unreadable weights ({exc})") from None


def linear_shapes(model: Any) -> dict[str, tuple[int, int]]:
    """(out, in) of every 2-D weight of a plain (not peft-wrapped) model, by module path."""
    shapes = {}
    for path, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if weight is not None and getattr(weight, "dim", lambda: 0)() == 2:
            shapes[path] = (int(weight.shape[0]), int(weight.shape[1]))
    return shapes


def check_adapter(
    directory: Path, base_model_id: str | None, shapes: dict[str, tuple[int, int]]
) -> dict[str, Any]:
    """The manifest of an adapter that fits a model with these `shapes`: checksums, the base
    model's identity, the config, and every tensor's name and shape. `AdapterError` otherwise."""
    from peft import LoraConfig

    manifest = verify_adapter(directory, base_model_id)
    tensors = load_adapter_tensors(directory)
    try:
        config = LoraConfig.from_pretrained(str(directory))
    except (OSError, ValueError, TypeError) as exc:
        raise AdapterError(f"adapter {directory}: unreadable {CONFIG} ({exc})") from None
    if not tensors:
        raise AdapterError(f"adapter {directory}: no weights")
    rank = int(config.r)
    for name, tensor in tensors.items():
        # peft's names: base_model.model.<module path>.lora_A.weight (or lora_B)
        part = "lora_A" if ".lora_A." in name else "lora_B" if ".lora_B." in name else None
        if part is None:
            raise AdapterError(f"adapter {directory}: unexpected tensor {name}")
        path = name.split(f".{part}.")[0].removeprefix("base_model.model.")
        if path not in shapes or tensor.dim() != 2:
            raise AdapterError(f"adapter {directory}: {path} is not a layer of the model")
        out_features, in_features = shapes[path]
        expected = (rank, in_features) if part == "lora_A" else (out_features, rank)
        if tuple(tensor.shape) != expected:
            raise AdapterError(
                f"adapter {directory}: {name} has shape {tuple(tensor.shape)}, "
                f"the model needs {expected}"
            )
    return manifest


def merge_into(base_model: Any, directory: Path) -> None:
    """Add the adapter in `directory` to `base_model`'s weights in place: W += s * B @ A for each
    LoRA layer, in float32 and rounded once to the weights' dtype (s = alpha / r, or alpha / sqrt(r)
    with rsLoRA). Check the adapter first (`check_adapter`).

    Written by hand rather than with peft's `merge_and_unload`, which computes the same sum but,
    on a bfloat16 model, left a forward pass 3.8 times as slow (its output head ran through a
    batched product that copies the 272 MB head every pass; 924 ms against 240 ms for 256 tokens
    on a 2-core Xeon, docs/next-edit.md)."""
    import math

    import torch
    from peft import LoraConfig

    config = LoraConfig.from_pretrained(str(directory))
    if getattr(config, "use_dora", False):
        raise AdapterError(f"adapter {directory}: DoRA adapters cannot be merged here")
    rank = int(config.r)
    scale = config.lora_alpha / (math.sqrt(rank) if config.use_rslora else rank)
    tensors = load_adapter_tensors(directory)
    modules = dict(base_model.named_modules())
    with torch.no_grad():
        for name, down in tensors.items():
            if ".lora_A." not in name:
                continue
            up = tensors[name.replace(".lora_A.", ".lora_B.")]
            weight = modules[name.split(".lora_A.")[0].removeprefix("base_model.model.")].weight
            delta = scale * (up.float() @ down.float())
            if config.fan_in_fan_out:
                delta = delta.T
            weight.copy_((weight.float() + delta).to(weight.dtype))


def apply_adapter(
    base_model: Any,
    directory: Path,
    base_model_id: str | None = None,
    shapes: dict[str, tuple[int, int]] | None = None,
) -> Any:
    """`base_model` (plain, not peft-wrapped) with the adapter in `directory` on it, for inference.

    Everything is checked first (`check_adapter`), so a bad adapter raises `AdapterError` before
    `base_model` is changed.
    """
    from peft import PeftModel

    check_adapter(directory, base_model_id, shapes or linear_shapes(base_model))
    model = PeftModel.from_pretrained(base_model, str(directory), is_trainable=False)
    model.eval()
    return model


def remove_adapter(model: Any) -> Any:
    """The base model under a peft model (LoRA layers taken out, not merged); others as they are."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        return model.unload()
    return model
