"""Where tabloop keeps its files: one rule for every command, the server and the backend."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "tabloop"
CACHE_DIR_VARIABLE = "TABLOOP_CACHE_DIR"


def default_cache_dir() -> Path:
    """`$TABLOOP_CACHE_DIR` when set, else the platform's cache directory for tabloop.

    Models, indexes, converted weights and output caches live here. This is the fallback once
    the configuration layers (`common.config`) name no `cache_dir`: there a `cacheDir` in the
    user's or the workspace's file gives way to the variable (the environment layer sits above
    the files), and a client's option or a command's flag beats both; see `resolve_cache_dir`.
    """
    configured = os.environ.get(CACHE_DIR_VARIABLE, "")
    return Path(configured).expanduser() if configured else platformdirs.user_cache_path(APP_NAME)


def resolve_cache_dir(configured: str | Path | None = None, *, create: bool = True) -> Path:
    """The cache directory: `configured` if given (a setting or a flag), else the default."""
    path = Path(configured).expanduser() if configured else default_cache_dir()
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def user_config_path() -> Path:
    """The user's own configuration file (`config.toml` in the platform's config directory)."""
    return platformdirs.user_config_path(APP_NAME) / "config.toml"


def user_data_dir() -> Path:
    """Where data that is not a cache lives (the backend's default SQLite database)."""
    return platformdirs.user_data_path(APP_NAME)
