"""The system's Chromium driven by Playwright, for the dashboard's tests.

Outside CI a machine without Chromium (or Playwright) skips the browser tests; under CI
(`CI=true`, as `.ci/run` installs Debian's `chromium`) a missing browser fails them. No step
downloads a browser. Screenshots go to `$TABLOOP_SCREENSHOTS` (default `build/dashboard`),
named at the end of the run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backend.dashboard import INDEX, STATIC_DIR

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM_ENV = "TABLOOP_CHROMIUM"
SCREENSHOTS_ENV = "TABLOOP_SCREENSHOTS"
_written: list[Path] = []


def chromium_path() -> str | None:
    """The Chromium to drive: `$TABLOOP_CHROMIUM`, else Debian's, else one on the PATH."""
    wanted = os.environ.get(CHROMIUM_ENV)
    if wanted:
        return wanted if Path(wanted).exists() else None
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI must run the browser tests: .ci/run installs chromium)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium for one test module.

    Playwright's sync API runs its own event loop on this thread while it is started: kept for
    the whole session, every asyncio test after it would find a loop running ("Runner.run()
    cannot be called from a running event loop"). Stopped with the module, it leaves none.
    """
    if not (STATIC_DIR / INDEX).is_file():
        pytest.fail("the dashboard is not built: run `make dashboard` (make test does)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("playwright is not installed (pip install -e '.[dev]')")
        raise
    executable = chromium_path()
    if executable is None:
        _unavailable("no Chromium here (Debian: apt-get install chromium)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox"]
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="session")
def screenshots() -> Path:
    """Where the pages' screenshots go."""
    folder = Path(os.environ.get(SCREENSHOTS_ENV) or ROOT / "build" / "dashboard")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def record_screenshot(path: Path) -> None:
    """Name `path` in the run's summary."""
    _written.append(path)


def written_screenshots() -> list[Path]:
    """Every screenshot written in this session."""
    return list(_written)
