"""The fast engines' copies of a model: converted once, atomically, under a lock, and verified.

CTranslate2 and ONNX Runtime GenAI each run their own model format. The first use of a model
converts it from the plain safetensors copy the torch runner keeps (`loading.py`; for the bundled
GGUF model that copy is itself made once), quantising the weights to the compute type. The result is
written into a temporary directory next to its final place, with a manifest holding the SHA-256 and
size of every file, and renamed into place: a process killed half-way leaves only a temporary
directory that the next conversion removes. Every load checks the manifest against the files; a copy
that does not match is deleted and converted again, never loaded.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from common.locks import file_lock
from common.manifest import read_manifest, reuse_or_clear, write_manifest
from completion.runners.loading import ModelSource, ensure_plain_copy

log = logging.getLogger(__name__)

ComputeType = Literal["int8", "int8_float32", "float32", "bfloat16"]
Engine = Literal["ctranslate2", "onnxruntime"]

ENGINE_DIR = "ct2"
# Each engine's directory under `<cache>/models` and the file that holds its weights.
ENGINE_DIRS: dict[str, str] = {"ctranslate2": ENGINE_DIR, "onnxruntime": "onnx"}
WEIGHTS: dict[str, str] = {"ctranslate2": "model.bin", "onnxruntime": "model.onnx.data"}
# The layout of each engine's converted copies (the manifest's `layout`): a copy made in an older
# one is converted again at its next load. ONNX 2: the token embedding in 8 bits too
# (`onnx_embedding`).
LAYOUTS: dict[str, int] = {"ctranslate2": 1, "onnxruntime": 2}
# Files the runner needs besides the weights: the tokenizer and the generation settings.
CARRIED = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json")

Progress = Callable[[str], None]


class ConversionError(RuntimeError):
    """The model could not be converted to the fast engine's format."""


def engine_path(
    source: ModelSource, compute_type: str, cache_dir: Path, engine: Engine = "ctranslate2"
) -> Path:
    """Where the converted copy of `source` for `compute_type` in `engine` lives."""
    weights = "int8" if compute_type.startswith("int8") else compute_type
    folder = ENGINE_DIRS[engine]
    return cache_dir / "models" / folder / f"{source.name}-{source.revision}-{weights}"


def _failure_path(model: str, compute_type: str, cache_dir: Path) -> Path:
    # `compute_type` names the engine too where two engines share one (`onnxruntime:int8`).
    digest = hashlib.sha256(f"{model}:{compute_type}".encode()).hexdigest()[:16]
    return cache_dir / "models" / ENGINE_DIR / f"failed-{digest}.txt"


def record_failure(model: str, compute_type: str, cache_dir: Path, message: str) -> None:
    """Remember why the fast engine could not run `model`, for `tabloop doctor`."""
    path = _failure_path(model, compute_type, cache_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(message + "\n", encoding="utf-8")
    except OSError:
        pass


def clear_failure(model: str, compute_type: str, cache_dir: Path) -> None:
    _failure_path(model, compute_type, cache_dir).unlink(missing_ok=True)


def last_failure(model: str, compute_type: str, cache_dir: Path) -> str | None:
    """Why the last attempt to run `model` in the fast engine failed, if it did."""
    try:
        return _failure_path(model, compute_type, cache_dir).read_text(encoding="utf-8").strip()
    except OSError:
        return None


def checksum(target: Path) -> str | None:
    """The converted weights' SHA-256 as the manifest records it."""
    manifest = read_manifest(target) or {}
    files = manifest.get("files") or {}
    weights = str(manifest.get("weights", "model.bin"))
    entry = files.get(weights) if isinstance(files, dict) else None
    return entry.get("sha256") if isinstance(entry, dict) else None


def _convert_into(plain: Path, work: Path, quantization: str, engine: Engine) -> None:
    if engine == "onnxruntime":
        from completion.runners.onnx_build import build_into

        build_into(plain, work, quantization)
        return
    from ctranslate2.converters import TransformersConverter

    converter = TransformersConverter(str(plain), low_cpu_mem_usage=True)
    converter.convert(str(work), quantization=quantization, force=True)
    for name in CARRIED:
        if (plain / name).is_file() and not (work / name).exists():
            shutil.copyfile(plain / name, work / name)


def _engine_version(engine: Engine) -> str:
    import importlib.metadata

    return importlib.metadata.version("onnxruntime-genai" if engine == "onnxruntime" else engine)


def ensure_converted(
    source: ModelSource,
    compute_type: str,
    cache_dir: Path,
    *,
    progress: Progress | None = None,
    engine: Engine = "ctranslate2",
) -> Path:
    """The directory of the converted model, converting it first when needed.

    Raises `ConversionError` when conversion fails; the caller falls back to the torch runner.
    """

    def plain_copy(_scratch: Path) -> Path:
        try:
            return ensure_plain_copy(source, cache_dir)
        except Exception as exc:
            raise ConversionError(f"could not read {source.name}: {exc}") from exc

    return convert_once(
        engine_path(source, compute_type, cache_dir, engine),
        source.name,
        compute_type,
        plain_copy,
        manifest={"source": f"{source.name}@{source.revision}"},
        progress=progress,
        duration="about a minute",
        engine=engine,
    )


def convert_once(
    target: Path,
    label: str,
    compute_type: str,
    prepare: Callable[[Path], Path],
    *,
    manifest: dict[str, Any],
    progress: Progress | None = None,
    duration: str = "a few minutes",
    engine: Engine = "ctranslate2",
    convert: Callable[[Path, Path], object] | None = None,
) -> Path:
    """`target`, a converted model with a verified manifest, converting it first when needed.

    Under an exclusive lock on `target`: a copy that verifies is returned as it is; a damaged one
    is deleted. Otherwise `prepare(scratch)` returns the plain (safetensors) model directory to
    convert; it may write that model into `scratch`, a temporary directory removed afterwards.
    The conversion is written into a temporary directory next to `target` with a manifest
    (`manifest` plus every file's size and SHA-256) and renamed into place. Errors other than
    `ConversionError` that `prepare` raises pass through unchanged, before anything is converted.
    `engine` is the format converted to; `convert(prepared, work)`, when given, writes the
    engine's model into `work` in place of the converter.
    """
    say = progress or (lambda message: log.info("%s", message))
    target.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(target.with_name(target.name + ".lock")):
        if reuse_or_clear(target, "converted model", LAYOUTS[engine]):
            return target
        say(f"preparing {label} for the fast engine (once)")
        started = time.perf_counter()
        scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.plain.", dir=target.parent))
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            plain = prepare(scratch)
            say(f"converting {label} to {compute_type} ({duration})")
            quantization = "int8" if compute_type.startswith("int8") else compute_type
            try:
                if convert is None:
                    _convert_into(plain, work, quantization, engine)
                else:
                    convert(plain, work)
                record = {
                    **manifest,
                    "quantization": quantization,
                    "engine": engine,
                    engine: _engine_version(engine),
                    "weights": WEIGHTS[engine],
                    "layout": LAYOUTS[engine],
                }
                write_manifest(work, record)
                for item in (work, *work.iterdir()):
                    item.chmod(0o755 if item.is_dir() else 0o644)
                work.rename(target)
            except Exception as exc:
                raise ConversionError(f"could not convert {label}: {exc}") from exc
        finally:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(scratch, ignore_errors=True)
        say(f"converted {label} in {time.perf_counter() - started:.0f} s")
        return target
