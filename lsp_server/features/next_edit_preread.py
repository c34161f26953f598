"""The start of the next prediction's prompt, read while the user is between edits
(`nextEdit.preread`).

A next-edit prompt starts with the recent edits, oldest first, one block each
(`completion.next_edit.prompt`), and its window comes after them. A prediction asked in an edit
the user has just begun somewhere starts with the blocks of the events before that edit, which
do not change while the user types it; and once the history's pause has passed after an edit,
the event is over, and the blocks the next event's prompt starts with are known. So:

- when a change begins an event, the model thread reads the blocks of the events before it
  (`NextEditPredictor.prompt_start`);
- when the history's pause passes without a change, it reads the blocks the next event's prompt
  will start with.

They go into the runner's KV-prefix cache (`completion.runners.base.PrefixReader`: the torch
runners), and the prediction asked at the pause computes only the rest of its prompt: its own
edit's block, the windows and the draft. A read is one more job on the model thread, read in
short passes (`PASS_TOKENS`; on a 2-core AMD EPYC in bfloat16, 172 ms a pass, 512 tokens in
1.38 s against 1.10 s in one pass), so that a stop loses little of it. Other work does not wait
for it: whatever comes to the model stops it within a decoder layer, keeping the passes it
finished:

- an inline completion request that needs the model, after which it is asked again, at most
  `TRIES` times;
- next-edit work (a prediction, or one computed ahead), which goes on from the passes finished
  when its prompt starts with them (most "no change" answers come from the screen, on the model
  thread, and would otherwise wait for a pass);
- a newer read, which replaces it.

The prompt starts otherwise when the new event's block does not fit the history's token budget
beside them (the oldest is left out), or when the adapter changes before the prediction (its keys
and values are the old weights'). Runners that keep no prompts (the fast engines, an HTTP
server) read nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from completion.next_edit import EditHistory, NextEditPredictor
from completion.next_edit.history import EditEvent
from completion.runners.base import PrefixReader
from completion.types import Cancelled, CancelToken

if TYPE_CHECKING:
    from lsp_server.server import TabloopServer

log = logging.getLogger(__name__)

TRIES = 3  # reads of the same blocks, each after an inline completion request stopped the last
PASS_TOKENS = 64
STOPPED_FOR_INLINE = "an inline completion request came to the model"
STOPPED_FOR_NEXT_EDIT = "next-edit work came to the model"


@dataclass
class PrereadCounters:
    started: int = 0  # reads put on the model thread (each try counted)
    tokens: int = 0  # prompt tokens computed by the reads that finished
    held: int = 0  # reads whose blocks the runner kept already
    stopped: int = 0  # reads stopped before they were done


@dataclass
class _Read:
    key: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]
    token: CancelToken = field(default_factory=CancelToken)
    tries: int = 0
    task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()


def blocks_key(
    events: Sequence[EditEvent], count: int
) -> tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]:
    """What the prompt's blocks of the newest `count` of `events` are made of: two reads with
    the same key read the same text (an event's place in its document is not in its block)."""
    newest = events[-count:] if count > 0 else []
    return tuple((e.path, e.original, e.updated) for e in newest)


class PromptPreread:
    """Reads the start of the next prediction's prompt on the model thread, for the next-edit
    feature: `after_change` after each recorded change, `stop_for_inline` when an inline
    completion request needs the model, `close` at shutdown."""

    def __init__(
        self,
        server: TabloopServer,
        history: EditHistory,
        predictor: Callable[[], NextEditPredictor | None],
        serve_adapter: Callable[[NextEditPredictor], Callable[[], None]],
    ) -> None:
        self.server = server
        self.history = history
        self.predictor = predictor
        self.serve_adapter = serve_adapter
        self.counters = PrereadCounters()
        self._read: _Read | None = None
        self._timer: asyncio.TimerHandle | None = None

    def after_change(self) -> None:
        """A change was recorded in the history: when it began an event, read the blocks of the
        events before it now; in any case, once the history's pause passes without another
        change, the blocks the next event's prompt starts with."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        settings = self.server.settings.next_edit
        if not settings.enabled or not settings.preread or settings.history_events <= 1:
            return
        events = self.history.events()
        if not events:
            return
        if events[-1].edits == 1:
            self._start(events[:-1])
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.history.pause_s, self._after_pause)

    def _after_pause(self) -> None:
        self._timer = None
        self._start(self.history.events())

    def stop_for_inline(self) -> None:
        """An inline completion request is about to run on the model: stop the read (it is
        asked again behind the request)."""
        self._stop(STOPPED_FOR_INLINE)

    def stop_for_next_edit(self) -> None:
        """Next-edit work is about to run on the model: stop the read (not asked again)."""
        self._stop(STOPPED_FOR_NEXT_EDIT)

    def _stop(self, reason: str) -> None:
        read = self._read
        if read is not None and read.running and not read.token.cancelled:
            read.token.cancel(reason)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        read, self._read = self._read, None
        if read is not None and read.running:
            read.token.cancel("shutdown")

    def _start(self, events: Sequence[EditEvent]) -> None:
        """Read the blocks a prediction after `events` starts with, unless this read is
        running already; a read of other blocks stops."""
        count = self.server.settings.next_edit.history_events - 1
        if not events or count <= 0:
            return
        key = blocks_key(events, count)
        current = self._read
        if current is not None and current.running:
            if current.key == key and not current.token.cancelled:
                return
            current.token.cancel("a newer read")
        read = self._read = _Read(key)
        self._submit(read, list(events))

    def _submit(self, read: _Read, events: list[EditEvent]) -> None:
        predictor = self.predictor()
        if predictor is None or not isinstance(predictor.runner, PrefixReader):
            return
        runner = predictor.runner
        serve = self.serve_adapter(predictor)
        token = read.token = CancelToken()
        read.tries += 1
        self.counters.started += 1

        def run() -> int:
            serve()
            token.raise_if_cancelled()
            text = predictor.prompt_start(events)
            return runner.read_prefix(text, token, pass_tokens=PASS_TOKENS)

        async def compute() -> None:
            self.server.completion_activity(True, "next_edit")  # background training pauses
            try:
                read_now = await asyncio.get_running_loop().run_in_executor(
                    self.server.model_executor, run
                )
            except Cancelled:
                self.counters.stopped += 1
                again = token.reason == STOPPED_FOR_INLINE and read.tries < TRIES
                if again and self._read is read:
                    self._submit(read, events)  # behind the inline request, on the model thread
                return
            except Exception:
                log.exception("reading the next prompt's start ahead failed")
                return
            finally:
                self.server.completion_activity(False, "next_edit")
            self.counters.tokens += read_now
            self.counters.held += read_now == 0

        read.task = asyncio.get_running_loop().create_task(compute())

    def status(self) -> dict[str, int]:
        return asdict(self.counters)
