"""When the next prediction's prompt start is read, and what stops it (`PromptPreread`), on the
real model thread with a runner that reads as long as the test lets it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from completion.next_edit import EditHistory, NextEditPredictor
from completion.next_edit.history import EditEvent
from completion.next_edit.text import document_lines
from completion.types import Cancelled, CancelToken
from lsp_server.config import Settings
from lsp_server.features.next_edit_preread import TRIES, PromptPreread
from lsp_server.server import ModelThread, TabloopServer

TEXT = "".join(f"value_{n} = {n}\n" for n in range(60))
FIRST = "x_value_0 = 0\nvalue_1 = 1\nvalue_2 = 2\n"  # the first edit's block: its line, 2 below


class HeldRunner:
    """A `PrefixReader` whose reads last until `release` is set or they are cancelled."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.reads: list[str] = []
        self.reading = threading.Event()

    def read_prefix(
        self,
        text: str,
        cancel: CancelToken,
        *,
        pass_tokens: int | None = None,
    ) -> int:
        self.reads.append(text)
        self.reading.set()
        while not self.release.wait(0.005):
            if cancel.cancelled:
                self.reading.clear()
                raise Cancelled(cancel.reason)
        return len(text)


@dataclass
class Predictor:
    runner: HeldRunner

    def prompt_start(self, events: Sequence[EditEvent]) -> str:
        return "|".join(e.updated_text for e in events[-2:])


@dataclass
class Server:
    settings: Settings = field(default_factory=Settings)
    model_executor: ModelThread = field(default_factory=ModelThread)
    activity: list[bool] = field(default_factory=list)

    def completion_activity(self, active: bool, kind: str = "inline") -> None:
        self.activity.append(active)


def setup(pause_s: float = 60.0) -> tuple[PromptPreread, EditHistory, HeldRunner, Server]:
    history = EditHistory(pause_s=pause_s)
    runner, server = HeldRunner(), Server()
    predictor = cast(NextEditPredictor, Predictor(runner))
    preread = PromptPreread(
        cast(TabloopServer, server), history, lambda: predictor, lambda _: lambda: None
    )
    return preread, history, runner, server


def edit(history: EditHistory, text: str, line: int) -> str:
    lines = list(document_lines(text))
    lines[line] = "x_" + lines[line]
    text = "".join(lines)
    history.record_edit("a.py", document_lines(text), line, 0, "", "x_")
    return text


async def until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 30  # not stuck
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.005)


async def reading_the_first_edit() -> tuple[PromptPreread, EditHistory, HeldRunner, str]:
    """Two edits far apart: the read of the first one's block, running (held)."""
    preread, history, runner, _ = setup()
    text = edit(history, TEXT, 0)
    text = edit(history, text, 30)
    preread.after_change()
    await until(runner.reading.is_set, "the read")
    return preread, history, runner, text


async def test_a_new_edit_reads_the_events_before_it_and_a_continued_one_nothing() -> None:
    preread, history, runner, server = setup()
    text = edit(history, TEXT, 0)
    preread.after_change()  # the first event: nothing before it
    text = edit(history, text, 30)
    preread.after_change()  # an event of its own: the one before it is read
    text = edit(history, text, 31)
    preread.after_change()  # the same event goes on: nothing new
    runner.release.set()
    await until(lambda: preread.counters.tokens > 0, "the read")
    assert runner.reads == [FIRST]
    assert preread.counters.started == 1 and preread.counters.stopped == 0
    assert server.activity == [True, False]  # training paused while it ran
    preread.close()


async def test_the_history_pause_reads_the_blocks_the_next_event_starts_with() -> None:
    preread, history, runner, _ = setup(pause_s=0.05)
    runner.release.set()
    text = edit(history, TEXT, 0)
    preread.after_change()
    text = edit(history, text, 30)
    preread.after_change()
    await until(lambda: len(runner.reads) == 2, "the read after the pause")
    assert runner.reads == [
        FIRST,
        "|".join(e.updated_text for e in history.events()),
    ]
    preread.close()


async def test_an_inline_request_stops_a_read_which_is_tried_again_behind_it() -> None:
    preread, _, runner, _ = await reading_the_first_edit()
    for tries in range(1, TRIES + 1):
        await until(runner.reading.is_set, f"try {tries}")
        preread.stop_for_inline()
        await until(lambda n=tries: preread.counters.stopped == n, f"try {tries} stopped")
    # Each try read the same blocks; after the last, none more.
    await asyncio.sleep(0.05)
    assert runner.reads == [FIRST] * TRIES
    assert preread.counters.started == TRIES and preread.counters.tokens == 0
    preread.close()


async def test_next_edit_work_stops_a_read_which_is_not_asked_again() -> None:
    preread, _, runner, _ = await reading_the_first_edit()
    preread.stop_for_next_edit()
    await until(lambda: preread.counters.stopped == 1, "the read stopped")
    await asyncio.sleep(0.05)
    assert len(runner.reads) == 1 and preread.counters.started == 1
    preread.close()


async def test_a_read_of_other_blocks_replaces_one_in_flight_and_the_same_does_not() -> None:
    preread, history, runner, text = await reading_the_first_edit()
    text = edit(history, text, 31)
    preread.after_change()  # the same event: the same blocks, still being read
    text = edit(history, text, 50)
    preread.after_change()  # a new event: other blocks
    await until(lambda: preread.counters.stopped == 1, "the first read stopped")
    runner.release.set()
    await until(lambda: preread.counters.tokens > 0, "the second read")
    assert len(runner.reads) == 2 and "x_value_31 = 31\n" in runner.reads[1]
    assert preread.counters.started == 2  # the stopped one was not tried again
    preread.close()


async def test_nothing_is_read_with_preread_off_or_a_runner_that_keeps_no_prompts() -> None:
    preread, history, runner, server = setup()
    server.settings.next_edit.preread = False
    text = edit(history, TEXT, 0)
    text = edit(history, text, 30)
    preread.after_change()
    server.settings.next_edit.preread = True
    preread.predictor = lambda: cast(NextEditPredictor, Predictor(cast(HeldRunner, object())))
    preread.after_change()
    await asyncio.sleep(0.05)
    assert runner.reads == [] and preread.counters.started == 0
    preread.close()
