"""Stale, superseded and cancelled requests, with the real engine in process.

Over stdio these races depend on timing; here the runner holds its first decode step until the
test has moved the document on, so each case is exact. The model is scripted (it emits a known
suggestion token by token, checking for cancellation between tokens like a real runner), so the
outcome does not depend on what a model would write on this CPU.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from lsprotocol import types

from completion import gate
from completion.engine import Engine
from completion.session import SessionSignals
from completion.settings import CompletionSettings
from completion.types import CancelToken, Generation, StopRule, Timings
from lsp_server.documents import adopt
from lsp_server.features.inline import build_request, decide
from lsp_server.features.session import TypingTracker
from lsp_server.server import TabloopServer
from tests.support.scripted_model import ScriptedModel

URI = "file:///work/example.py"
TEXT = "def area(width, height):\n    return \n\n\nprint(area(2, 3))\n"
CURSOR = types.Position(line=1, character=11)


class HeldRunner:
    """A runner whose first decode step waits until the test releases it."""

    def __init__(self, inner: ScriptedModel) -> None:
        self.inner = inner
        self.model_id = inner.model_id
        self.family = inner.family
        self.started = threading.Event()
        self.release = threading.Event()
        self.steps_after_release = 0
        self.last: Generation | None = None

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def generate(
        self,
        prompt: str,
        *,
        max_new_tokens: int,
        stop: StopRule,
        cancel: CancelToken,
        temperature: float = 0.0,
    ) -> Generation:
        def held_stop(text: str) -> int | None:
            if not self.started.is_set():
                self.started.set()
                assert self.release.wait(30), "the test never released the runner"
            else:
                self.steps_after_release += 1
            return stop(text)

        self.last = self.inner.generate(
            prompt,
            max_new_tokens=max_new_tokens,
            stop=held_stop,
            cancel=cancel,
            temperature=temperature,
        )
        return self.last

    def close(self) -> None:
        self.inner.close()


SUGGESTION = "width * height"


@pytest.fixture
def server() -> tuple[TabloopServer, HeldRunner]:
    runner = HeldRunner(ScriptedModel(rules={"    return ": SUGGESTION}))
    ls = TabloopServer()
    # pygls's own initialize step, which sets up the workspace (no user handlers registered).
    next(
        ls.protocol.lsp_initialize(
            types.InitializeParams(capabilities=types.ClientCapabilities(), root_uri=None)
        ),
        None,
    )
    settings = CompletionSettings(model="held", max_new_tokens=32, cache=False)
    always = gate.builtin_policy().with_floor(1.0)
    ls.engine = Engine(settings, runner, policy_source=lambda: always)
    ls.model_state = "ready"
    # What `didOpen` does: pygls's workspace takes the document, then our `Document` replaces it.
    item = types.TextDocumentItem(uri=URI, language_id="python", version=1, text=TEXT)
    ls.workspace.put_text_document(item)
    adopt(ls.workspace, item)
    return ls, runner


async def start_request(ls: TabloopServer, runner: HeldRunner) -> asyncio.Task[Any]:
    task = asyncio.get_running_loop().create_task(
        decide(ls, URI, CURSOR, "automatic", TypingTracker(SessionSignals()))
    )
    started = await asyncio.get_running_loop().run_in_executor(None, runner.started.wait, 30)
    assert started, "the engine never reached the model"
    return task


def outcomes(ls: TabloopServer) -> list[str]:
    """How each request ended, from its timing record (one a request)."""
    return [timing["outcome"] for timing in ls.request_timings]


def type_character(ls: TabloopServer, version: int) -> None:
    ls.workspace.update_text_document(
        types.VersionedTextDocumentIdentifier(uri=URI, version=version),
        types.TextDocumentContentChangePartial(
            range=types.Range(start=CURSOR, end=CURSOR), text="w"
        ),
    )


async def test_an_answer_for_a_version_the_editor_left_is_empty(
    server: tuple[TabloopServer, HeldRunner],
) -> None:
    ls, runner = server
    task = await start_request(ls, runner)
    type_character(ls, 2)  # the document moves on while the model works
    runner.release.set()
    assert await task is None
    assert ls.counters.stale == 1
    assert ls.decisions == {}  # nothing was recorded as shown for the old version
    assert outcomes(ls) == ["stale"]


async def test_a_newer_request_supersedes_the_running_one_within_a_step(
    server: tuple[TabloopServer, HeldRunner],
) -> None:
    ls, runner = server
    task = await start_request(ls, runner)
    ls.begin_request(URI)  # what a newer request for the same document does
    runner.release.set()
    assert await task is None
    assert ls.counters.cancelled == 1
    assert runner.last is not None and runner.last.stop_reason == "cancelled"
    assert runner.steps_after_release <= 1
    assert outcomes(ls) == ["cancelled"]


async def test_cancel_request_stops_the_model(server: tuple[TabloopServer, HeldRunner]) -> None:
    ls, runner = server
    task = await start_request(ls, runner)
    task.cancel()  # pygls cancels the handler's task on `$/cancelRequest`
    await asyncio.sleep(0)
    runner.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ls.in_flight == {}
    assert outcomes(ls) == ["cancelled"]
    # The model thread finishes its step, sees the token and stops.
    await asyncio.get_running_loop().run_in_executor(ls.model_executor, lambda: None)
    assert runner.last is not None and runner.last.stop_reason == "cancelled"
    assert runner.steps_after_release <= 1


async def test_current_request_is_answered(server: tuple[TabloopServer, HeldRunner]) -> None:
    ls, runner = server
    task = await start_request(ls, runner)
    runner.release.set()
    answer = await task
    assert answer is not None
    decision, request = answer
    assert decision.shown and decision.text == SUGGESTION
    assert request.version == 1 and ls.counters.shown == 1
    assert outcomes(ls) == ["shown"]


class RhythmAfterAWait(TypingTracker):
    """The likely rest of the pause: `first` when the request arrives, `later` on every look after
    (the user stayed idle past their short pauses)."""

    def __init__(self, first: float, later: float) -> None:
        super().__init__(SessionSignals())
        self.looks = [first]
        self.later = later

    def likely_pause_ms(self, uri: str) -> float | None:
        value = self.looks[-1] if len(self.looks) == 1 else self.later
        self.looks.append(self.later)
        return value


async def test_a_prompt_that_proves_slow_waits_for_the_pause_and_is_then_served(
    server: tuple[TabloopServer, HeldRunner],
) -> None:
    """The estimate before the prompt said the suggestion would come in time; the prompt, once
    built, takes longer to read than the pause expected then. The request waits for the pause
    to outlast it, as the early check's requests do, and is served: no latency skip."""
    ls, runner = server
    engine = ls.engine
    assert engine is not None
    engine.settings.latency_skip = True
    engine.latency.observe(10, 200.0)
    engine.latency.observe(10, 200.0)  # 20 ms a prompt token
    document = ls.workspace.get_text_document(URI)
    request = build_request(document, CURSOR, "automatic")  # type: ignore[arg-type]
    early = engine.predicted_ms(request)
    prompt, _ = engine._prompt(request, gate.Signals(), Timings())
    with_prompt = engine.predicted_ms(request, prompt)
    assert early is not None and with_prompt is not None and early < with_prompt
    typing = RhythmAfterAWait(first=(early + with_prompt) / 2, later=10 * with_prompt)
    task = asyncio.get_running_loop().create_task(decide(ls, URI, CURSOR, "automatic", typing))
    runner.release.set()
    found = await asyncio.wait_for(task, 30)
    assert found is not None and found[0].text == SUGGESTION
    assert engine.latency_skips == 0
    (timing,) = ls.request_timings
    assert timing["outcome"] == "shown" and timing["wait_ms"] > 0 and timing["reached_model"]
