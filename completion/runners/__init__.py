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
    from completion.runners.local import LocalRunner

    return LocalRunner(
        settings.model,
        cache_dir,
        dtype=settings.dtype,
        threads=settings.threads,
        reuse_cache=settings.cache,
        family=family,
    )
