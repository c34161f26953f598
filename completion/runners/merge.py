"""An adapter for a fast engine: merged into the base weights and converted, once per version.

CTranslate2 and ONNX Runtime GenAI run a plain model here; they add no LoRA layers at run time. So
serving an adapter (`completion.adapters`) there takes three steps, all off the serving path: the
float base model is loaded with transformers, the adapter is applied with peft and merged into the
weights (`merge_and_unload`), and the merged model is converted with the same converter and
quantisation as the base (`conversion.convert_once`: under a lock, into a temporary directory
renamed into place, with a manifest of checksums checked at every load). The result lives in
`<cache>/models/<engine>/merged/`, keyed by the base model's identity, the adapter's checksums and
the compute type, so each adapter version is merged once and survives restarts; a damaged or half-
written copy fails its manifest check and is rebuilt, never loaded.

The adapter's checksums and base model are checked before anything is read or written, and every
tensor's name and shape before it touches the model: a damaged adapter is refused with
`AdapterError`.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path

from common.memory import release_memory
from completion.adapters import (
    CONFIG,
    WEIGHTS,
    AdapterError,
    check_adapter,
    linear_shapes,
    verify_adapter,
)
from completion.runners.conversion import (
    CARRIED,
    ENGINE_DIRS,
    ConversionError,
    Engine,
    Progress,
    convert_once,
    ensure_converted,
)
from completion.runners.loading import ModelSource, ensure_plain_copy

log = logging.getLogger(__name__)

MERGED_DIR = "merged"


def base_identity(source: ModelSource) -> str:
    """The base model's identity as adapter manifests record it (`name@revision`)."""
    return f"{source.name}@{source.revision}"


def adapter_key(manifest: dict[str, object]) -> str:
    """A short key for an adapter's content: its config's and weights' checksums."""
    files = manifest.get("files")
    assert isinstance(files, dict)  # `verify_adapter` checked it
    content = f"{files.get(CONFIG)}:{files.get(WEIGHTS)}"
    return hashlib.sha256(content.encode()).hexdigest()[:16]


def merged_path(
    source: ModelSource,
    key: str,
    compute_type: str,
    cache_dir: Path,
    engine: Engine = "ctranslate2",
) -> Path:
    """Where the merged and converted copy of base `source` + the adapter with `key` lives."""
    weights = "int8" if compute_type.startswith("int8") else compute_type
    return (
        cache_dir
        / "models"
        / ENGINE_DIRS[engine]
        / MERGED_DIR
        / f"{source.name}-{source.revision}-{key}-{weights}"
    )


def merge_adapter(base_plain: Path, adapter: Path, base_id: str, target: Path) -> None:
    """Write base + adapter, merged into plain float32 weights, as a model directory at `target`.

    Raises `AdapterError` (before the model is changed) when the adapter does not fit the model.
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_plain), dtype=torch.float32)
    model.eval()
    check_adapter(adapter, base_id, linear_shapes(model))
    wrapped = PeftModel.from_pretrained(model, str(adapter), is_trainable=False)
    merged = wrapped.merge_and_unload()
    merged.save_pretrained(str(target), safe_serialization=True)
    for name in CARRIED:
        if (base_plain / name).is_file() and not (target / name).exists():
            shutil.copyfile(base_plain / name, target / name)


def ensure_merged(
    source: ModelSource,
    adapter: Path,
    compute_type: str,
    cache_dir: Path,
    *,
    progress: Progress | None = None,
    engine: Engine = "ctranslate2",
) -> Path:
    """The converted directory of base `source` with `adapter` merged in, made first if needed.

    Raises `AdapterError` for an adapter that is damaged or made for another base model (nothing
    is written then), `ConversionError` when merging or converting fails.
    """
    base_id = base_identity(source)
    manifest = verify_adapter(adapter, base_id)
    version = str(manifest.get("version", adapter.name))
    target = merged_path(source, adapter_key(manifest), compute_type, cache_dir, engine)

    def merge(scratch: Path) -> Path:
        plain = _plain_copy(source, cache_dir)
        say = progress or (lambda message: log.info("%s", message))
        say(f"merging adapter {version} into {source.name}")
        try:
            merge_adapter(plain, adapter, base_id, scratch)
        except AdapterError:
            raise
        except Exception as exc:
            raise ConversionError(f"could not merge adapter {version}: {exc}") from exc
        finally:
            release_memory()  # the merged torch model, before the converter loads it again
        return scratch

    files = manifest["files"]
    record: dict[str, object] = {
        "source": base_id,
        "adapter": version,
        "adapter_files": {name: files.get(name) for name in (CONFIG, WEIGHTS)},
    }
    label = f"{source.name} with adapter {version}"
    if engine == "onnxruntime":
        patched = _patched(
            source, adapter, compute_type, cache_dir, target, label, record, progress
        )
        if patched is not None:
            return patched
    return convert_once(
        target,
        label,
        compute_type,
        merge,
        manifest={**record, "made_by": "merged by peft, converted by the builder"},
        progress=progress,
        engine=engine,
    )


def _plain_copy(source: ModelSource, cache_dir: Path) -> Path:
    try:
        return ensure_plain_copy(source, cache_dir)
    except Exception as exc:
        raise ConversionError(f"could not read {source.name}: {exc}") from exc


def _patched(
    source: ModelSource,
    adapter: Path,
    compute_type: str,
    cache_dir: Path,
    target: Path,
    label: str,
    record: dict[str, object],
    progress: Progress | None,
) -> Path | None:
    """`target` made from the engine's copy of the base model with the adapted matrices
    quantised again (`onnx_patch`); None when that does not apply and the builder must convert
    a merged copy instead (said in the log). Nothing is read when `target` is already made."""
    from completion.runners.onnx_patch import Unpatchable, patch_into, plain_linear_shapes

    plain: list[Path] = []  # the plain copy, once `prepare` has found it

    def prepare(_scratch: Path) -> Path:
        plain.append(_plain_copy(source, cache_dir))
        # AdapterError (passed through) before anything is made
        check_adapter(adapter, str(record["source"]), plain_linear_shapes(plain[0]))
        return ensure_converted(
            source, compute_type, cache_dir, progress=progress, engine="onnxruntime"
        )

    try:
        return convert_once(
            target,
            label,
            compute_type,
            prepare,
            manifest={**record, "made_by": "the base copy's adapted matrices quantised again"},
            progress=progress,
            duration="seconds",
            engine="onnxruntime",
            convert=lambda base, work: patch_into(base, plain[0], adapter, work),
        )
    except (Unpatchable, ConversionError) as exc:
        refused = exc if isinstance(exc, Unpatchable) else exc.__cause__
        if not isinstance(refused, Unpatchable):
            raise
        log.info("%s: %s; merging and converting with the builder", label, refused)
        return None


def serving_weights(
    source: ModelSource,
    adapter: Path | None,
    compute_type: str,
    cache_dir: Path,
    base_path: Path,
    *,
    progress: Progress | None = None,
    engine: Engine = "ctranslate2",
) -> tuple[Path, str | None]:
    """The converted weights a fast runner loads to serve `adapter` on base `source` (None: the
    base model at `base_path`) and the adapter's version; merged and converted once
    (`ensure_merged`)."""
    from completion.adapters import read_manifest

    if adapter is None:
        return base_path, None
    path = ensure_merged(source, adapter, compute_type, cache_dir, progress=progress, engine=engine)
    return path, str(read_manifest(adapter).get("version", adapter.name))
