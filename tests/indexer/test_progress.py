"""`StageProgress`: one finished line per stage, on a terminal and in a file alike."""

from __future__ import annotations

import io
import re

from indexer.progress import INDEX, LOAD, READY, SCAN, StageProgress

# What the index reports for five changed files embedded in two batches.
REPORTS = [(SCAN, 0, 0), (SCAN, 5, 5), (INDEX, 0, 5), (INDEX, 3, 5), (INDEX, 5, 5), (READY, 5, 5)]


def _screen(written: str) -> list[str]:
    """What a terminal shows: a carriage return goes back to the start of the line."""
    return [line.rsplit("\r", 1)[-1].rstrip() for line in written.split("\n") if line.strip()]


def _run(interactive: bool) -> str:
    stream = io.StringIO()
    progress = StageProgress(stream, interactive=interactive)
    progress.begin(LOAD)
    for report in REPORTS:
        progress(*report)
    progress.close()
    return stream.getvalue()


def test_in_a_file_each_stage_is_one_line() -> None:
    written = _run(interactive=False)
    assert "\r" not in written
    lines = written.splitlines()
    assert [re.sub(r"in \d+\.\d s", "in T", line) for line in lines] == [
        "loading the embedding model in T",
        "scanning: 5/5 files in T",
        "indexing files: 5/5 files in T",
    ]


def test_on_a_terminal_each_stage_is_one_finished_bar() -> None:
    screen = _screen(_run(interactive=True))
    assert len(screen) == 3
    assert screen[0].startswith("loading the embedding model [")
    assert screen[1].startswith("scanning: 100%|") and "5/5" in screen[1]
    assert screen[2].startswith("indexing files: 100%|") and "5/5" in screen[2]


def test_disabled_writes_nothing() -> None:
    stream = io.StringIO()
    progress = StageProgress(stream, enabled=False)
    for report in REPORTS:
        progress(*report)
    progress.close()
    assert stream.getvalue() == ""
