"""Model runners: where a FIM prompt becomes a continuation."""

from __future__ import annotations

import logging
from pathlib import Path

from completion.runners.base import ModelRunner
from completion.settings import CompletionSettings

log = logging.getLogger(__name__)


def load_runner(settings: CompletionSettings, cache_dir: Path) -> ModelRunner:
    """The runner the settings ask for: in-process (`local`) or an OpenAI-compatible server.

    Loading a local model takes seconds to minutes; call this off the event loop.
    """
    family = None if settings.fim_template == "auto" else settings.fim_template
    if settings.runner == "http":
        from completion.runners.http import HttpRunner

        return HttpRunner(
            settings.http_url,
            model=settings.http_model,
            api_key=settings.http_api_key,
            timeout_s=settings.http_timeout_s,
            family=family,
        )
    if settings.engine != "torch":
        fast = _load_fast_runner(settings, cache_dir, family)
        if fast is not None:
            return fast
    from completion.runners.local import LocalRunner

    return LocalRunner(
        settings.model,
        cache_dir,
        dtype=settings.dtype,
        threads=settings.threads,
        reuse_cache=settings.cache,
        family=family,
    )


def _load_fast_runner(
    settings: CompletionSettings, cache_dir: Path, family: str | None
) -> ModelRunner | None:
    """The CTranslate2 runner, or None (with one clear message) when it cannot be used."""
    try:
        from completion.runners.conversion import ConversionError, record_failure
        from completion.runners.ct2 import Ct2Runner
    except ImportError as exc:
        message = f"CTranslate2 is not installed ({exc}); using the torch runner"
        if settings.engine == "ctranslate2":
            raise RuntimeError(message) from exc
        log.warning("%s", message)
        return None
    compute_type = "int8" if settings.dtype == "auto" else settings.dtype
    try:
        return Ct2Runner(
            settings.model,
            cache_dir,
            compute_type=compute_type,
            threads=settings.threads,
            family=family,
        )
    except (ConversionError, RuntimeError, OSError, ValueError) as exc:
        record_failure(settings.model, compute_type, cache_dir, str(exc))
        if settings.engine == "ctranslate2":
            raise
        log.warning("the fast engine cannot run this model (%s); using the torch runner", exc)
        return None
