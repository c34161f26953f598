"""Model runners: where a FIM prompt becomes a continuation."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from completion.runners.base import ModelRunner
from completion.settings import CompletionSettings

if TYPE_CHECKING:
    from completion.runners.ct2 import Ct2Runner
    from completion.runners.onnx import OnnxRunner

log = logging.getLogger(__name__)


def load_runner(
    settings: CompletionSettings,
    cache_dir: Path,
    *,
    progress: Callable[[str], None] | None = None,
    user: str = "",
) -> ModelRunner:
    """The runner the settings ask for: in-process (`local`) or an OpenAI-compatible server.

    `user` is the installation's id, which an OpenAI-compatible server is sent with each request
    (the backend's adapter canary picks the installation's arm by it).

    Loading a local model takes seconds to minutes; call this off the event loop.
    """
    family = None if settings.fim_template == "auto" else settings.fim_template
    if settings.runner == "http":
        from completion.runners.http import HttpRunner

        return HttpRunner(
            settings.http_url,
            model=settings.http_model,
            adapter=settings.http_adapter,
            api_key=settings.http_api_key,
            timeout_s=settings.http_timeout_s,
            family=family,
            user=user,
        )
    adapter = Path(settings.adapter).expanduser() if settings.adapter else None
    if settings.engine != "torch":
        fast: Ct2Runner | OnnxRunner | None = None
        if fast_engine(settings) == "onnxruntime":
            fast = _load_onnx_runner(settings, cache_dir, family, progress)
        if fast is None and settings.engine != "onnxruntime" and settings.dtype != "int4":
            fast = _load_fast_runner(settings, cache_dir, family, progress)
        if fast is not None:
            if adapter is not None:
                # Merged into the base weights and converted the first time (minutes on a real
                # model), found in the cache afterwards; a bad adapter stops the load, as on torch.
                try:
                    fast.install(fast.prepare_adapter(adapter, progress=progress))
                except BaseException:
                    fast.close()
                    raise
            return fast
    from completion.runners.torch_runner import TorchRunner

    return TorchRunner(
        settings.model,
        cache_dir,
        # 4-bit weights exist in ONNX Runtime GenAI only; torch runs its own default then.
        dtype="auto" if settings.dtype == "int4" else settings.dtype,
        threads=settings.threads,
        reuse_cache=settings.cache,
        family=family,
        speculative=settings.speculative,
        speculative_tokens=settings.speculative_tokens,
        adapter=adapter,
    )


def fast_engine(settings: CompletionSettings) -> str:
    """The engine `completion.engine` asks for first: `auto` is ONNX Runtime GenAI, or
    CTranslate2 where the weights asked for are float (`completion.dtype`)."""
    if settings.engine == "auto":
        return "ctranslate2" if settings.dtype in ("float32", "bfloat16") else "onnxruntime"
    return settings.engine


def onnx_precision(settings: CompletionSettings) -> str:
    """The ONNX engine's weights: `int8` unless `completion.dtype` is `int4` (faster to decode,
    but it writes worse code: docs/models.md)."""
    return "int4" if settings.dtype == "int4" else "int8"


def _load_onnx_runner(
    settings: CompletionSettings,
    cache_dir: Path,
    family: str | None,
    progress: Callable[[str], None] | None,
) -> OnnxRunner | None:
    """The ONNX Runtime GenAI runner, or None (with one clear message) when it cannot be used;
    `auto` then tries CTranslate2."""
    precision = onnx_precision(settings)
    try:
        from completion.runners.conversion import ConversionError, record_failure
        from completion.runners.onnx import OnnxRunner
    except ImportError as exc:
        message = f"ONNX Runtime GenAI is not installed ({exc})"
        if settings.engine == "onnxruntime":
            raise RuntimeError(message) from exc
        log.warning("%s; trying CTranslate2", message)
        return None
    try:
        return OnnxRunner(
            settings.model,
            cache_dir,
            precision="int8" if precision == "int8" else "int4",
            threads=settings.threads,
            family=family,
            progress=progress,
            reuse_prefix=settings.cache,
        )
    except (ConversionError, RuntimeError, OSError, ValueError) as exc:
        record_failure(settings.model, f"onnxruntime:{precision}", cache_dir, str(exc))
        if settings.engine == "onnxruntime":
            raise
        log.warning("ONNX Runtime GenAI cannot run this model (%s); trying CTranslate2", exc)
        return None


def _load_fast_runner(
    settings: CompletionSettings,
    cache_dir: Path,
    family: str | None,
    progress: Callable[[str], None] | None,
) -> Ct2Runner | None:
    """The CTranslate2 runner, or None (with one clear message) when it cannot be used."""
    try:
        from completion.runners.conversion import ComputeType, ConversionError, record_failure
        from completion.runners.ct2 import Ct2Runner
    except ImportError as exc:
        message = f"CTranslate2 is not installed ({exc}); using the torch runner"
        if settings.engine == "ctranslate2":
            raise RuntimeError(message) from exc
        log.warning("%s", message)
        return None
    compute_type: ComputeType = "int8"  # for `auto`, and for `int4`, which this engine lacks
    if settings.dtype == "float32" or settings.dtype == "bfloat16":
        compute_type = settings.dtype
    try:
        return Ct2Runner(
            settings.model,
            cache_dir,
            compute_type=compute_type,
            threads=settings.threads,
            family=family,
            progress=progress,
            reuse_prefix=settings.cache,
        )
    except (ConversionError, RuntimeError, OSError, ValueError) as exc:
        record_failure(settings.model, compute_type, cache_dir, str(exc))
        if settings.engine == "ctranslate2":
            raise
        log.warning("the fast engine cannot run this model (%s); using the torch runner", exc)
        return None


def _expected_source(settings: CompletionSettings, cache_dir: Path) -> Any:
    """The model's identity without assembling or loading anything (None when unknown)."""
    from completion.bundled import BUNDLED_NAME, BUNDLED_SHA256
    from completion.runners.loading import ModelSource, resolve_source

    if settings.model == "bundled":
        return ModelSource("", "bundled.gguf", BUNDLED_NAME, BUNDLED_SHA256[:12])
    try:
        return resolve_source(settings.model, cache_dir)
    except (OSError, ValueError):
        return None


def needs_transformers(settings: CompletionSettings, cache_dir: Path) -> bool:
    """Whether loading the runner will import transformers (and torch).

    Only a fast engine with its converted model at hand does without them; a first use
    converts with transformers, and a fallback runs torch.
    """
    if settings.runner == "http":
        return False
    engine = fast_engine(settings)
    module = "onnxruntime_genai" if engine == "onnxruntime" else "ctranslate2"
    if settings.engine == "torch" or importlib.util.find_spec(module) is None:
        return True
    from common.manifest import MANIFEST
    from completion.runners.conversion import engine_path

    source = _expected_source(settings, cache_dir)
    if source is None:
        return True
    target = engine_path(source, _compute_type(settings, engine), cache_dir, engine)  # type: ignore[arg-type]
    return not (target / MANIFEST).is_file()


def _compute_type(settings: CompletionSettings, engine: str) -> str:
    if engine == "onnxruntime":
        return onnx_precision(settings)
    return "int8" if settings.dtype == "auto" else settings.dtype


def engine_status(settings: CompletionSettings, cache_dir: Path) -> dict[str, Any]:
    """What `tabloop doctor` says about the local engine, without loading or converting anything."""
    import importlib.metadata

    from common.manifest import read_manifest, verify
    from completion.runners.conversion import WEIGHTS, engine_path, last_failure

    report: dict[str, Any] = {"requested": settings.engine}
    if settings.runner == "http":
        return {**report, "engine": "http"}
    if settings.engine == "torch":
        return {**report, "engine": "torch"}
    engine = fast_engine(settings)
    package = "onnxruntime-genai" if engine == "onnxruntime" else "ctranslate2"
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return {**report, "engine": "torch", "problem": f"{package} is not installed"}
    compute_type = _compute_type(settings, engine)
    failure_key = f"onnxruntime:{compute_type}" if engine == "onnxruntime" else compute_type
    report.update({"engine": engine, "engine_version": version, "compute_type": compute_type})
    source = _expected_source(settings, cache_dir)
    if source is None:
        return {**report, "problem": f"completion.model {settings.model} cannot be found"}
    target = engine_path(source, compute_type, cache_dir, engine)  # type: ignore[arg-type]
    report["converted_model"] = str(target)
    failure = last_failure(settings.model, failure_key, cache_dir)
    if not target.exists():
        report["converted"] = False
        if failure:
            fallback = "CTranslate2" if engine == "onnxruntime" else "torch"
            report["engine"] = "ctranslate2" if engine == "onnxruntime" else "torch"
            report["problem"] = f"the fast engine ({engine}) fell back to {fallback}: {failure}"
        return report
    problem = verify(target)
    manifest = read_manifest(target) or {}
    files = manifest.get("files") or {}
    weights = str(manifest.get("weights", WEIGHTS[engine]))
    report["converted"] = problem is None
    report["converted_sha256"] = (files.get(weights) or {}).get("sha256")
    if problem is not None:
        report["problem"] = f"the converted model is damaged ({problem}); it is rebuilt at next use"
    return report
