"""Indexing progress on a terminal: one bar per stage, each finished before the next begins.

The index reports `progress(stage, done, total)` from its worker thread (`indexer.pipeline.
Progress`); `tabloop index`, `tabloop search` and the demo show it with `StageProgress`. On a
terminal each stage is a tqdm bar left in place when the next starts, so the screen ends as the
list of stages with their counts and times. Anywhere else (a pipe, a file, a CI log) a bar would
write every refresh after a carriage return; there each stage prints one line when it finishes.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, TextIO

LOAD, SCAN, INDEX, READY = "load", "scan", "index", "ready"
"""The stages, in order. The index reports `scan`, `index` and `ready` (the end); `load` (the
embedding model loading, before the first report) is begun by the caller with `begin`."""

LABELS = {LOAD: "loading the embedding model", SCAN: "scanning", INDEX: "indexing files"}


def quiet_library_bars() -> None:
    """Turn off the model libraries' own progress bars (Hugging Face downloads and weight
    loading): written to the same terminal line as ours, the two overwrite each other.

    A user's own `HF_HUB_DISABLE_PROGRESS_BARS` wins.
    """
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] != "1":
        return
    if "transformers" in sys.modules:  # already imported: the variable was read then
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()


class StageProgress:
    """A `progress(stage, done, total)` callback that shows one stage at a time on `stream`.

    `interactive` (default: whether `stream` is a terminal) chooses bars or one line per
    finished stage. Calls come from the index's worker thread and `begin`/`close` from the
    caller's, so a lock keeps them from interleaving.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        enabled: bool = True,
        interactive: bool | None = None,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.interactive = _is_terminal(self.stream) if interactive is None else interactive
        self._lock = threading.Lock()
        self._stage = ""
        self._bar: Any = None
        self._started = 0.0
        self._done = 0
        self._total = 0
        if enabled:
            quiet_library_bars()

    def begin(self, stage: str) -> None:
        """Show `stage` as under way before its first report (the model loading)."""
        self(stage, 0, 0)

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        with self._lock:
            if stage != self._stage:
                self._finish()
                if stage == READY:
                    return
                self._start(stage, total)
            self._done, self._total = done, max(total, self._total)
            if self._bar is not None:
                if total and self._bar.total != total:
                    self._bar.total = total
                self._bar.n = done
                self._bar.refresh()

    def close(self) -> None:
        """Finish the stage under way (the bar stays on screen)."""
        with self._lock:
            self._finish()

    def _start(self, stage: str, total: int) -> None:
        self._stage = stage
        self._started = time.perf_counter()
        self._done = self._total = 0
        if not self.interactive:
            return
        from tqdm import tqdm

        label = LABELS.get(stage, stage)
        counted = stage != LOAD
        self._bar = tqdm(
            total=total or None,
            desc=label,
            unit="file",
            file=self.stream,
            leave=True,
            dynamic_ncols=True,
            # Until the total is known a bar has nothing to fill: show the count and the time.
            bar_format=None
            if total
            else ("{desc}: {n_fmt} files [{elapsed}]" if counted else "{desc} [{elapsed}]"),
        )

    def _finish(self) -> None:
        if not self._stage:
            return
        if self._bar is not None:
            if self._bar.total is not None and self._stage != LOAD:
                # A total learnt after the bar began: give the finished bar its proper shape.
                self._bar.bar_format = None
            self._bar.close()
            self._bar = None
        elif not self.interactive:
            seconds = time.perf_counter() - self._started
            label = LABELS.get(self._stage, self._stage)
            if self._stage != LOAD:
                counts = f"{self._done}/{self._total}" if self._total else f"{self._done}"
                label = f"{label}: {counts} files"
            print(f"{label} in {seconds:.1f} s", file=self.stream, flush=True)
        self._stage = ""


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or bare stream
        return False
