"""The shared completion model of `POST /v1/completions`: loading it, and generating with it.

One runner (from `completion.runners.load_runner` with the backend's completion settings) is
loaded on the first request, or at start with `preload`, and serves every request. Stop
sequences are cut whole: streamed text never contains one, not even part of one, because text
that could begin one is held back until it cannot.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from pathlib import Path

from completion.fim import UnknownFamily, template_for
from completion.runners.base import ModelRunner
from completion.settings import CompletionSettings
from completion.types import CancelToken, Generation

log = logging.getLogger(__name__)

RunnerLoader = Callable[[CompletionSettings, Path], ModelRunner]


@dataclass(frozen=True)
class CompletionJob:
    """What to generate: a validated request, free of its HTTP form."""

    prompt: str
    max_tokens: int
    temperature: float
    stops: list[str]


@dataclass(frozen=True)
class StreamFailure:
    """A streamed generation that raised; `message` is what the client is told."""

    message: str


StreamItem = str | Generation | StreamFailure
"""One item of `CompletionService.stream`: a piece of text, the finished generation (last), or
a failure (then nothing more)."""


class CompletionService:
    """One lazily loaded runner shared by every request of the backend."""

    def __init__(
        self,
        settings: CompletionSettings,
        cache_dir: Path,
        loader: RunnerLoader | None = None,
    ) -> None:
        self.settings = settings
        self.cache_dir = cache_dir
        self._loader = loader
        self._runner: ModelRunner | None = None
        self._lock = threading.Lock()

    def runner(self) -> ModelRunner:
        """The runner, loaded on first use (blocking; call from a worker thread)."""
        with self._lock:
            if self._runner is None:
                if self._loader is None:
                    # Imported here: the model stack is heavy and most backends never load it.
                    from completion.runners import load_runner

                    self._loader = load_runner
                started = time.perf_counter()
                try:
                    self._runner = self._loader(self.settings, self.cache_dir)
                except Exception:
                    log.exception("could not load the completion model")
                    raise
                log.info("completion model loaded in %.1fs", time.perf_counter() - started)
            return self._runner

    def preload(self) -> threading.Thread:
        """Load in a background thread now, so the first request does not wait as long."""

        def load() -> None:
            # A failure is logged in runner(); the next request tries again and reports it.
            with contextlib.suppress(Exception):
                self.runner()

        thread = threading.Thread(target=load, name="tabloop-model-load", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        """Release the loaded runner (a later request loads it again)."""
        with self._lock:
            if self._runner is not None:
                self._runner.close()
                self._runner = None

    @staticmethod
    def generate(
        runner: ModelRunner,
        job: CompletionJob,
        cancel: CancelToken,
        emit: Callable[[str], None] | None = None,
    ) -> Generation:
        """Run the model (blocking); `emit` receives each piece of text that can no longer be
        retracted."""
        # The model's own end markers are cut by the runner too; held back here, they never stream.
        stops = job.stops + [s for s in _template_stops(runner) if s not in job.stops]
        sent = 0

        def stop_rule(text: str) -> int | None:
            nonlocal sent
            cut = _first_stop(text, stops)
            if cut is not None:
                return cut
            if emit is not None:
                safe = len(text) - held_back(text, stops)
                if safe > sent:
                    emit(text[sent:safe])
                    sent = safe
            return None

        generation = runner.generate(
            job.prompt,
            max_new_tokens=job.max_tokens,
            stop=stop_rule,
            cancel=cancel,
            temperature=job.temperature,
        )
        if emit is not None and len(generation.text) > sent:
            emit(generation.text[sent:])  # what was held back and turned out not to be a stop
        return generation

    async def stream(
        self, runner: ModelRunner, job: CompletionJob
    ) -> AsyncGenerator[StreamItem, None]:
        """Generate in a worker thread and yield each piece as it becomes final, then the
        generation. Closing the iterator early (a client that went away) cancels the generation
        within one decode step; close it explicitly (`contextlib.aclosing`) so that happens
        at once."""
        pieces: queue.Queue[StreamItem | None] = queue.Queue()
        cancel = CancelToken()

        def work() -> None:
            try:
                pieces.put(self.generate(runner, job, cancel, pieces.put))
            except Exception as exc:
                log.exception("completion failed")
                pieces.put(StreamFailure(f"{type(exc).__name__}: {exc}"))
            finally:
                pieces.put(None)

        thread = threading.Thread(target=work, name="tabloop-completion", daemon=True)
        thread.start()
        try:
            while (item := await asyncio.to_thread(pieces.get)) is not None:
                yield item
        finally:
            if thread.is_alive():
                cancel.cancel("client disconnected")


def held_back(text: str, stops: list[str]) -> int:
    """Length of the longest end of `text` that could still grow into a stop sequence."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


def _first_stop(text: str, stops: list[str]) -> int | None:
    cuts = [index for stop in stops if (index := text.find(stop)) >= 0]
    return min(cuts) if cuts else None


def _template_stops(runner: ModelRunner) -> list[str]:
    try:
        return list(template_for(runner.family).stop_tokens)
    except UnknownFamily:
        return []
