"""`textDocument/inlineCompletion`, and `textDocument/completion` for clients without it."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lsprotocol import types
from pygls.uris import to_fs_path

from common.languages import request_language
from completion.types import Cancelled, CompletionRequest, Decision, TooLate, TriggerKind
from lsp_server.documents import Document, open_document
from lsp_server.features.prefetch import PrefetchFeature
from lsp_server.features.session import SessionFeature, TypingTracker
from lsp_server.protocol import ACCEPT_COMMAND, RequestOutcome, RequestTiming
from lsp_server.server import TabloopServer

if TYPE_CHECKING:
    from completion import gate

log = logging.getLogger(__name__)


def language_of(document: Document) -> str:
    """The request's LSP language id: the client's (an editor's alias mapped to it), else the one
    of the file's extension (`common.languages.request_language`, as every offline path asks)."""
    return request_language(document.language_id, document.path)


def build_request(
    document: Document, position: types.Position, trigger: TriggerKind
) -> CompletionRequest:
    """The engine's view of a cursor in an LSP document."""
    source = document.source
    offset = document.offset_at_position(position)
    path = to_fs_path(document.uri)
    return CompletionRequest(
        prefix=source[:offset],
        suffix=source[offset:],
        language=language_of(document),
        path=path,
        uri=document.uri,
        version=document.version or 0,
        trigger=trigger,
        line=position.line,
        character=position.character,
    )


def signals_for(ls: TabloopServer, uri: str, typing: TypingTracker) -> gate.Signals:
    """The session's signals for a decision in `uri` (one definition: `completion.session`)."""
    return typing.session.signals(uri)


async def decide(
    ls: TabloopServer,
    uri: str,
    position: types.Position,
    trigger: TriggerKind,
    typing: TypingTracker,
) -> tuple[Decision, CompletionRequest] | None:
    """Run the engine for a cursor; None when there is nothing to show (or nothing current).

    Whatever happens, the request leaves exactly one timing record of its own (`RequestTiming`)
    in `ls.request_timings`, saying how it ended."""
    ls.counters.requests += 1
    record = _Record(str(ls.protocol.msg_id or ""), time.perf_counter())
    ls.completion_activity(True)
    try:
        return await _decide(ls, uri, position, trigger, typing, record)
    except asyncio.CancelledError:
        record.outcome = "cancelled"
        raise
    except Exception:
        record.outcome = "error"
        raise
    finally:
        ls.request_timings.append(record.timing())
        ls.completion_activity(False)


async def _decide(
    ls: TabloopServer,
    uri: str,
    position: types.Position,
    trigger: TriggerKind,
    typing: TypingTracker,
    record: _Record,
) -> tuple[Decision, CompletionRequest] | None:
    engine = ls.engine
    if engine is None or not ls.settings.completion.enabled:
        record.outcome = "not_ready"
        return None  # before the model is ready: answer at once, empty
    document = open_document(ls.workspace, uri)
    if document is None:
        record.outcome = "no_document"
        return None  # never opened: nothing of ours to complete, and the disk is not a buffer
    request = build_request(document, position, trigger)
    prefetch = ls.find_feature(PrefetchFeature)
    if prefetch is not None:
        await prefetch.before_request(request)
    pause_ms = typing.likely_pause_ms(uri)
    waited_from = time.perf_counter()
    if engine.late_by(request, pause_ms) is not None:
        ls.cancel_in_flight(uri, "superseded")  # what was in flight here is stale too
        try:
            pause_ms = await wait_for_a_long_pause(
                lambda: engine.late_by(request, typing.likely_pause_ms(uri)) is not None,
                lambda: typing.likely_pause_ms(uri),
                lambda: _is_current(ls, uri, request),
                ls.settings.completion.latency_wait_ms,
            )
        except asyncio.CancelledError:  # the next keystroke: nothing was computed
            ls.counters.cancelled += 1
            record.wait_ms = (time.perf_counter() - waited_from) * 1000
            raise
        if not _is_current(ls, uri, request):
            ls.counters.stale += 1
            record.outcome = "stale"
            return None
    record.wait_ms = (time.perf_counter() - waited_from) * 1000
    skipped = engine.skip_early(request, pause_ms)
    if skipped is not None:
        ls.cancel_in_flight(uri, "superseded")  # what was in flight here is stale too
        ls.remember(skipped, request)
        record.decided(skipped)
        return None
    token = ls.begin_request(uri)
    loop = asyncio.get_running_loop()
    signals = signals_for(ls, uri, typing)
    wait_ms = ls.settings.completion.latency_wait_ms
    try:
        decision: Decision | None = None
        defer = wait_ms > 0
        while decision is None:
            complete = functools.partial(
                engine.complete, request, token, signals, pause_ms=pause_ms, defer_late=defer
            )
            # Next-edit work on the model thread stops for it (the answer may come from the
            # completion cache there, but the thread runs one job at a time), but for the edit
            # after one the user took with Tab, which it waits for.
            if await ls.model_turn("inline") and not _is_current(ls, uri, request):
                ls.counters.stale += 1
                record.outcome = "stale"
                return None
            record.reached_model = True
            try:
                decision = await loop.run_in_executor(ls.model_executor, complete)
            except TooLate as late:
                # The prompt takes longer to read than the estimate before it said (its context
                # changed): wait as above, for what is left of the wait, for the pause to outlast
                # the prediction, then ask once more; late again, it is a latency skip. The model
                # did not run: a request the next key cancels in this wait is no model call.
                record.reached_model = False
                defer = False
                pause_ms = await _wait_for_the_pause_to_outlast(
                    ls, uri, request, typing, late.predicted_ms, wait_ms - record.wait_ms, record
                )
                if not _is_current(ls, uri, request):
                    ls.counters.stale += 1
                    record.outcome = "stale"
                    return None
    except Cancelled:
        ls.counters.cancelled += 1
        record.outcome = "cancelled"
        return None
    except asyncio.CancelledError:
        # `$/cancelRequest`: stop the model within one decode step, then let pygls answer.
        token.cancel("cancelled by the client")
        ls.counters.cancelled += 1
        raise
    finally:
        ls.end_request(uri, token)
    current = open_document(ls.workspace, uri)
    if current is None or (current.version or 0) != request.version:
        ls.counters.stale += 1
        record.decided(decision)
        record.outcome = "stale"
        return None
    ls.remember(decision, request)
    record.decided(decision)
    if not decision.shown:
        return None
    if prefetch is not None:
        prefetch.start(decision, request)
    return decision, request


async def _wait_for_the_pause_to_outlast(
    ls: TabloopServer,
    uri: str,
    request: CompletionRequest,
    typing: TypingTracker,
    predicted_ms: float,
    budget_ms: float,
    record: _Record,
) -> float | None:
    """`wait_for_a_long_pause` for a request whose prompt is read in `predicted_ms`: the likely
    pause when the wait ends (at most `budget_ms`), its time added to `record.wait_ms`."""

    def late() -> bool:
        pause = typing.likely_pause_ms(uri)
        return pause is not None and predicted_ms > pause

    started = time.perf_counter()
    try:
        return await wait_for_a_long_pause(
            late,
            lambda: typing.likely_pause_ms(uri),
            lambda: _is_current(ls, uri, request),
            max(0.0, budget_ms),
        )
    finally:
        record.wait_ms += (time.perf_counter() - started) * 1000


async def wait_for_a_long_pause(
    late: Callable[[], bool],
    pause_ms: Callable[[], float | None],
    current: Callable[[], bool],
    wait_ms: float,
    step_ms: float = 50.0,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> float | None:
    """Wait while a suggestion would come too late (`late()`), at most `wait_ms`; the likely
    pause when the wait ends.

    A pause's likely rest is read from the user's rhythm given how long they have been idle
    (`completion.latency`): at the editor's first request a fluent typist's pauses look short,
    but one who stays idle past their word-boundary pauses is probably thinking, and the rest of
    that pause is long. Looking again every `step_ms` lets such a pause be served instead of
    answered empty. The wait ends early when the document changes (`current()` false: the
    request is stale) or the client cancels the request (the next keystroke). `clock` (seconds)
    and `sleep` are real time unless a test passes a fake clock.
    """
    deadline = clock() + wait_ms / 1000
    while clock() < deadline and current() and late():
        await sleep(step_ms / 1000)
    return pause_ms()


def _is_current(ls: TabloopServer, uri: str, request: CompletionRequest) -> bool:
    document = open_document(ls.workspace, uri)
    return document is not None and (document.version or 0) == request.version


_SILENCE_OUTCOMES: dict[str, RequestOutcome] = {
    "policy": "silenced",
    "empty": "empty",
    "latency": "latency_skip",
}


@dataclass
class _Record:
    """What one request has done so far; `timing()` is its record when the handler ends."""

    request_id: str
    started: float
    outcome: RequestOutcome = "error"
    wait_ms: float = 0.0
    reached_model: bool = False
    decision: Decision | None = None

    def decided(self, decision: Decision) -> None:
        self.decision = decision
        reason = decision.silence_reason
        self.outcome = "shown" if reason is None else _SILENCE_OUTCOMES[reason]

    def timing(self) -> RequestTiming:
        decision = self.decision
        generation = decision.generation if decision else None
        return {
            "request_id": self.request_id,
            "outcome": self.outcome,
            "reached_model": self.reached_model,
            "handler_ms": (time.perf_counter() - self.started) * 1000,
            "wait_ms": self.wait_ms,
            "model_ms": decision.timings.model_ms if decision else 0.0,
            "context_ms": decision.timings.context_ms if decision else 0.0,
            "prompt_tokens": generation.prompt_tokens if generation else 0,
            "prefill_tokens": (
                generation.prompt_tokens - generation.reused_tokens if generation else 0
            ),
            "prefill_ms": generation.prefill_ms if generation else 0.0,
            "decode_ms": generation.decode_ms if generation else 0.0,
            "new_tokens": generation.new_tokens if generation else 0,
            "cache_hit": float(decision.cache_hit) if decision else 0.0,
            "cache_source": decision.cache_source if decision else "",
            "candidates": 1 + len(decision.alternatives) if decision else 0,
            "retrieval_found": (
                float(decision.features.get("retrieval_found", 0.0)) if decision else 0.0
            ),
            "action": decision.action if decision else "",
            "reason": decision.reason if decision else "",
            "predicted_ms": decision.timings.predicted_ms if decision else 0.0,
            "likely_pause_ms": decision.timings.likely_pause_ms if decision else 0.0,
        }


def accept_command(decision: Decision) -> types.Command:
    return types.Command(
        title="Accept tabloop suggestion",
        command=ACCEPT_COMMAND,
        arguments=[decision.decision_id],
    )


def register(server: TabloopServer) -> None:
    def typing_of(ls: TabloopServer) -> TypingTracker:
        # The session feature registers after telemetry (its outcomes follow the decision's
        # event), so it is found per request.
        return ls.feature_of(SessionFeature).typing

    @server.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
    async def inline_completion(
        ls: TabloopServer, params: types.InlineCompletionParams
    ) -> types.InlineCompletionList | None:
        trigger: TriggerKind = (
            "invoked"
            if params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
            else "automatic"
        )
        try:
            answer = await decide(
                ls, params.text_document.uri, params.position, trigger, typing_of(ls)
            )
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("inline completion failed")
            return types.InlineCompletionList(items=[])
        if answer is None:
            return types.InlineCompletionList(items=[])
        decision, _ = answer
        return types.InlineCompletionList(
            items=[
                types.InlineCompletionItem(
                    insert_text=candidate.text,
                    range=types.Range(start=params.position, end=params.position),
                    command=accept_command(candidate),
                )
                for candidate in [decision, *decision.alternatives]
            ]
        )

    @server.feature(
        types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(trigger_characters=[".", "(", " "])
    )
    async def completion(
        ls: TabloopServer, params: types.CompletionParams
    ) -> types.CompletionList | None:
        if ls.client.inline_completion:
            # The client shows ghost text already; a popup item would say the same twice.
            return types.CompletionList(is_incomplete=True, items=[])
        invoked = (
            params.context is not None
            and params.context.trigger_kind == types.CompletionTriggerKind.Invoked
        )
        try:
            answer = await decide(
                ls,
                params.text_document.uri,
                params.position,
                "invoked" if invoked else "automatic",
                typing_of(ls),
            )
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("completion failed")
            return types.CompletionList(is_incomplete=True, items=[])
        if answer is None:
            return types.CompletionList(is_incomplete=True, items=[])
        decision, _ = answer
        first_line = decision.text.strip().splitlines()[0] if decision.text.strip() else ""
        return types.CompletionList(
            # Incomplete: every keystroke asks again, so the suggestion follows the typing.
            is_incomplete=True,
            items=[
                types.CompletionItem(
                    label=first_line[:80] or decision.text,
                    kind=types.CompletionItemKind.Snippet,
                    detail="tabloop",
                    documentation=types.MarkupContent(
                        kind=types.MarkupKind.Markdown, value=f"```\n{decision.text}\n```"
                    ),
                    text_edit=types.TextEdit(
                        range=types.Range(start=params.position, end=params.position),
                        new_text=decision.text,
                    ),
                    insert_text_format=types.InsertTextFormat.PlainText,
                    insert_text_mode=types.InsertTextMode.AsIs,
                    sort_text="0",
                    command=accept_command(decision),
                )
            ],
        )
