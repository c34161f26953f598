"""Fixtures of the dashboard's tests (`tests/support/browser.py`): the system's Chromium, and
where screenshots go (named at the end of the run)."""

from __future__ import annotations

from typing import Any

from tests.support.browser import browser, screenshots, written_screenshots

__all__ = ["browser", "screenshots"]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    written = written_screenshots()
    if written:
        names = ", ".join(sorted(p.name for p in written))
        terminalreporter.write_line(f"dashboard screenshots in {written[0].parent}: {names}")
