"""Finding and loading weights for the local runner: HF directories, hub ids, GGUF files.

GGUF weights are quantised; transformers dequantises them into torch tensors, which for the
bundled 0.5B model takes minutes on a small CPU. The first load therefore also writes the
dequantised model as safetensors into the cache directory (keyed by the file's checksum), and
every later load reads that instead, in seconds. The first load in bfloat16 keeps a bfloat16 copy
beside it, so that later bfloat16 loads (training's) read half the bytes.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from completion.bundled import BUNDLED_NAME, BUNDLED_SHA256, bundled_model_path

log = logging.getLogger(__name__)

Dtype = Literal["auto", "bfloat16", "float32", "int8"]
ConcreteDtype = Literal["bfloat16", "float32", "int8"]

AUTO_DTYPE: ConcreteDtype = "float32"
"""What `dtype = "auto"` loads on a CPU; chosen by measurement, see docs/models.md."""

CONVERTED_DIR = "converted"
_COMPLETE = ".complete"


@dataclass(frozen=True)
class ModelSource:
    """Where weights come from: what `from_pretrained` needs, and a stable identity."""

    location: str  # directory or hub id
    gguf_file: str | None
    name: str
    revision: str  # short checksum or hub revision


def _fingerprint(path: Path) -> str:
    """A cheap content fingerprint: name, size and the first and last MiB of a file."""
    digest = hashlib.sha256(f"{path.name}:{path.stat().st_size}".encode())
    with path.open("rb") as handle:
        digest.update(handle.read(1 << 20))
        handle.seek(max(path.stat().st_size - (1 << 20), 0))
        digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:12]


def _directory_fingerprint(directory: Path) -> str:
    digest = hashlib.sha256()
    for item in sorted(directory.iterdir()):
        if item.is_file():
            digest.update(f"{item.name}:{item.stat().st_size}".encode())
            if item.suffix == ".json":
                digest.update(item.read_bytes())
    return digest.hexdigest()[:12]


def resolve_source(model: str, cache_dir: Path) -> ModelSource:
    """Interpret the `completion.model` setting."""
    if model == "bundled":
        path = bundled_model_path(cache_dir)
        return ModelSource(str(path.parent), path.name, BUNDLED_NAME, BUNDLED_SHA256[:12])
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"completion.model: GGUF file {path} does not exist")
        return ModelSource(str(path.parent), path.name, path.stem, _fingerprint(path))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"completion.model: {path} is a directory without config.json, not a model"
            )
        return ModelSource(str(path), None, path.name, _directory_fingerprint(path))
    if model.startswith((".", "/", "~")) or os.sep in model.strip("/").replace("/", "", 1):
        raise FileNotFoundError(f"completion.model: {model} does not exist")
    # A Hugging Face hub id: the user named it, so transformers may download it.
    return ModelSource(model, None, model.rsplit("/", 1)[-1], "hub")


def resolve_dtype(dtype: Dtype) -> ConcreteDtype:
    """The dtype `auto` stands for on this machine, or `dtype` itself."""
    return AUTO_DTYPE if dtype == "auto" else dtype


def converted_path(
    source: ModelSource, cache_dir: Path, dtype: Literal["float32", "bfloat16"] = "float32"
) -> Path:
    """Where the dequantised copy of a GGUF model is kept (float32), or its bfloat16 copy."""
    suffix = "" if dtype == "float32" else f"-{dtype}"
    return cache_dir / "models" / CONVERTED_DIR / f"{source.name}-{source.revision}{suffix}"


def _plain_state(model: Any) -> dict[str, Any] | None:
    """The model's tensors, tied ones once; None when some are not plain floats (packed blocks)."""
    state: dict[str, Any] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        if not tensor.is_floating_point():
            return None
        storage = tensor.untyped_storage().data_ptr()
        if storage in seen:  # tied weights (lm_head = embed_tokens): saved once, re-tied on load
            continue
        seen.add(storage)
        state[name] = tensor.detach().contiguous()
    return state


def save_converted(tokenizer: Any, model: Any, target: Path) -> bool:
    """Write a dequantised model as a plain safetensors model directory, atomically.

    transformers' `save_pretrained` refuses models loaded from GGUF (their quantiser is not
    serialisable) even when every weight is already a plain tensor, so the weights are written
    with safetensors and the config without its GGUF quantisation entry. Returns False (and logs)
    when the model cannot be kept; that only costs the next load its time.
    """
    from safetensors.torch import save_file

    state = _plain_state(model)
    if state is None:
        log.info("not keeping a converted copy: the weights stay packed in GGUF blocks")
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        save_file(state, str(work / "model.safetensors"), metadata={"format": "pt"})
        config = copy.deepcopy(model.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(work)
        model.generation_config.save_pretrained(work)
        tokenizer.save_pretrained(work)
        (work / _COMPLETE).write_text("ok\n", encoding="ascii")
        # mkdtemp makes a private directory; a model cache is not secret.
        for item in (work, *work.iterdir()):
            item.chmod(0o755 if item.is_dir() else 0o644)
        os.rename(work, target)
        return True
    except OSError as exc:
        if (target / _COMPLETE).is_file():
            return True  # another process kept it first
        log.warning("could not keep the converted model in %s: %s", target, exc)
        return False
    finally:
        shutil.rmtree(work, ignore_errors=True)


def load_model(source: ModelSource, dtype: ConcreteDtype, cache_dir: Path) -> tuple[Any, Any]:
    """(tokenizer, model in eval mode) for `source` in `dtype`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    location: str = source.location
    extra: dict[str, Any] = {}
    convert_to: Path | None = None
    halve_to: Path | None = None
    if source.gguf_file and dtype == "bfloat16":
        # Read from a float32 file, the bfloat16 weights cost the file's pages (2 GB for the
        # bundled model, resident while read) on top of themselves: the first bfloat16 load
        # keeps a bfloat16 copy, and later ones read that (a training run's peak stays lower).
        halved = converted_path(source, cache_dir, "bfloat16")
        if (halved / _COMPLETE).is_file():
            location = str(halved)
        else:
            halve_to = halved
    if source.gguf_file and location == source.location:
        converted = converted_path(source, cache_dir)
        if (converted / _COMPLETE).is_file():
            location = str(converted)
        else:
            extra["gguf_file"] = source.gguf_file
            convert_to = converted
    tokenizer = AutoTokenizer.from_pretrained(location, **extra)
    model: Any
    if convert_to is not None:
        log.info("dequantising %s once; later loads use %s", source.gguf_file, convert_to)
        model = AutoModelForCausalLM.from_pretrained(location, dtype=torch.float32, **extra)
        save_converted(tokenizer, model, convert_to)
        model = model.to(torch_dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(location, dtype=torch_dtype)
    if halve_to is not None:
        save_converted(tokenizer, model, halve_to)
    model.eval()
    if dtype == "int8":
        model = quantize_int8(model)
    return tokenizer, model


def ensure_plain_copy(source: ModelSource, cache_dir: Path) -> Path:
    """A directory holding `source` as plain safetensors weights with its tokenizer files.

    For a GGUF model that is the dequantised copy (made now if it does not exist yet); a local
    directory is used as it is; a hub id is downloaded (the user named it).
    """
    if source.gguf_file:
        converted = converted_path(source, cache_dir)
        if not (converted / _COMPLETE).is_file():
            load_model(source, "float32", cache_dir)  # dequantises and keeps the copy
        if not (converted / _COMPLETE).is_file():
            raise OSError(f"could not keep a dequantised copy of {source.gguf_file}")
        return converted
    location = Path(source.location)
    if location.is_dir():
        return location
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(source.location))


def quantize_int8(model: Any) -> Any:
    """Dynamic int8 quantisation of every Linear layer (weights int8, activations per call)."""
    import torch
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        # torch announces a move of this API to torchao; it still works and needs no extra package.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        return quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
