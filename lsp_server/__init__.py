"""tabloop's language server: inline completion that learns when to speak."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tabloop")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"
