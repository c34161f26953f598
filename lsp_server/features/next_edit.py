"""Next edits: `textDocument/copilotInlineEdit` (and `tabloop/nextEdit`), their outcomes.

The feature keeps the workspace's edit history (`completion.next_edit.EditHistory`) from the
document stream: each `didChange` edit, with the text it removed, is recorded under the
document's workspace-relative path, against the text right after it (`record_change`). The
history stays in memory; it is never sent anywhere (at telemetry level `full` the shown window
and its prediction travel with the next-edit events).

A request is answered `{"edits": []}` at once, on the event loop, when the version it names is
not the document's, when next edits are off or the model is not loaded, or when the predictor
can tell without the model that there is nothing to predict (no recent edit near the cursor).
Otherwise the prediction runs on the model thread, one per document: a newer request, an edit
to the document, its closing or `$/cancelRequest` cancels the one in flight within one decode
step, and so does an inline completion request about to run on the model anywhere (an inline
suggestion is worth more than a rewrite that has to wait; one answered without the model leaves
the rewrite running), but for the edit after one the user took with Tab, which the inline
request waits for (`on_model_turn`). It runs on the runner `nextEdit.engine` names: the engine's
own, or a torch bfloat16 runner of the same model, loaded on a thread of its own once the engine
is ready (requests are answered empty until then). That runner serves the
workspace's next-edit adapter where one serves (the next-edit track's registry,
`training.edit_track`: what the training loop trains there, read again when the registry file
changes), else the adapter the engine serves (`completion.next_edit.runner`). An answer whose
document changed meanwhile is empty. Every request leaves one `NextEditTiming`
(`tabloop/nextEditTimings`).

**Accepting, and the prediction after it.** For a prediction answered with edits the feature
keeps the document that accepting it makes. The editor's change that makes it is recorded in the
history as an event of its own (`completion.next_edit.accepted`), not merged into the user's
edit before it. With `nextEdit.prefetch`, the model thread computes, while the user reads the
prediction, the one that accepting it leads to: the cursor after the last edit, the acceptance
recorded in a copy of the history as the editor's change will be. The predictor keeps that
rewrite by its prompt, so the request after Tab, which builds the same prompt, is answered
without a model call (waiting for it under its cancel token when it is not done). A change that
does not make the accepted document, a dismissal, closing the document, a newer request there or
an edit elsewhere drops it; an inline completion request that runs on the model stops it (within
a decoder layer) until it is accepted, then waits for it.

**The next prompt's start, read between edits** (`nextEdit.preread`,
`lsp_server.features.next_edit_preread`): when a change begins an event, or the history's pause
passes after one, the model thread reads the recent edits' blocks that the next prediction's
prompt starts with into the runner's KV-prefix cache, and that prediction computes only the rest.

Outcomes: the editor says when it shows a prediction (`textDocument/didShowInlineEdit` or
`tabloop/nextEditShown`), runs `tabloop.acceptNextEdit` when the user accepts it, and sends
`tabloop/nextEditRejected` with a reason otherwise; each becomes a `NextEditEvent` for
telemetry. The gate does not decide next edits, and their outcomes are not fed to the session
signals the gate reads (its features describe inline suggestions; mixing next-edit outcomes in
would change what they mean without retraining it).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lsprotocol import types
from pydantic import ValidationError
from pygls.uris import to_fs_path

from completion.adapters import AdapterError
from completion.next_edit import Edit, EditHistory, NextEditPrediction, NextEditPredictor
from completion.next_edit.accepted import accepted_state, applied, cursor_after
from completion.next_edit.runner import follow_adapter, load_next_edit_runner, next_edit_engine
from completion.next_edit.screen import ScreenError, load_screen
from completion.types import Cancelled, CancelToken
from lsp_server.config import Settings
from lsp_server.documents import Document, DocumentChange, DocumentListener, open_document
from lsp_server.features.inline import language_of
from lsp_server.features.next_edit_preread import PromptPreread
from lsp_server.features.telemetry import TelemetryFeature
from lsp_server.protocol import (
    ACCEPT_NEXT_EDIT_COMMAND,
    ACCEPT_NEXT_EDIT_TITLE,
    CONFIGURATION_SECTION,
    DID_SHOW_INLINE_EDIT_NOTIFICATION,
    NEXT_EDIT_CAPABILITY,
    NEXT_EDIT_REJECTED_NOTIFICATION,
    NEXT_EDIT_REQUEST,
    NEXT_EDIT_SHOWN_NOTIFICATION,
    NEXT_EDIT_TIMINGS_REQUEST,
    TABLOOP_NEXT_EDIT_REQUEST,
    NextEditItem,
    NextEditOutcome,
    NextEditParams,
    NextEditRejectedParams,
    NextEditResult,
    NextEditShownParams,
    NextEditTiming,
    read_params,
    to_wire,
)
from lsp_server.server import ModelWork, TabloopServer
from telemetry.events import MAX_TEXT_CHARS, Latency, NextEditEvent, NextEditKind
from training.edit_track import edit_registry
from training.registry import REGISTRY_FILE, AdapterRegistryError

if TYPE_CHECKING:
    from completion.runners.base import ModelRunner
    from completion.runners.torch_runner import TorchRunner

log = logging.getLogger(__name__)

PREDICTIONS_KEPT = 256
TIMINGS_KEPT = 1024
REWRITES_KEPT = 4  # the predictor's kept rewrites: a prefetch's, and a few repeated requests'


@dataclass
class Answered:
    """A prediction the server answered with edits, kept for its outcomes."""

    prediction_id: str
    uri: str
    language: str
    trigger: str
    prediction: NextEditPrediction
    answered_at: float
    shown_at: float | None = None
    finished: bool = False


@dataclass
class NextEditCounters:
    requests: int = 0
    predicted: int = 0
    model_calls: int = 0
    shown: int = 0
    accepted: int = 0
    rejected: int = 0
    prefetch_started: int = 0
    prefetch_used: int = 0  # requests answered with a prefetch's rewrite, no model call
    prefetch_cancelled: int = 0


@dataclass
class _Ahead:
    """A prediction answered with edits: the document accepting it makes, whether the editor's
    change made it, and the prediction there being computed ahead (`task`: None without
    `nextEdit.prefetch`)."""

    prediction_id: str
    lines: tuple[str, ...]
    cursor_line: int  # where accepting leaves the cursor (the window's centre)
    accepted: bool = False
    token: CancelToken = field(default_factory=CancelToken)
    task: asyncio.Task[None] | None = None

    @property
    def computing(self) -> bool:
        return self.task is not None and not self.task.done() and not self.token.cancelled


@dataclass
class _Record:
    """What one request has done so far; `timing()` is its record when the handler ends."""

    request_id: str
    started: float
    outcome: NextEditOutcome = "error"
    prediction: NextEditPrediction | None = None
    edits: int = 0

    def timing(self) -> NextEditTiming:
        found = self.prediction
        timings = found.timings if found is not None else None
        window = found.window if found is not None else None
        return {
            "request_id": self.request_id,
            "outcome": self.outcome,
            "reason": found.reason if found is not None else "",
            "reached_model": bool(timings and timings.reached_model),
            "handler_ms": (time.perf_counter() - self.started) * 1000,
            "window_ms": timings.window_ms if timings else 0.0,
            "screen_ms": timings.screen_ms if timings else 0.0,
            "screen": found.screen if found is not None else None,
            "prompt_ms": timings.prompt_ms if timings else 0.0,
            "model_ms": timings.model_ms if timings else 0.0,
            "diff_ms": timings.diff_ms if timings else 0.0,
            "window_lines": len(window.lines) if window is not None else 0,
            "window_tokens": timings.window_tokens if timings else 0,
            "prompt_tokens": timings.prompt_tokens if timings else 0,
            "cached_tokens": timings.cached_tokens if timings else 0,
            "new_tokens": timings.new_tokens if timings else 0,
            "draft_tokens": timings.draft_tokens if timings else 0,
            "draft_accepted": timings.draft_accepted if timings else 0,
            "reused": bool(timings and timings.reused),
            "edits": self.edits,
        }


@dataclass
class NextEditFeature(DocumentListener):
    """Owns the edit history, the predictor on the engine's runner, and the answered
    predictions."""

    server: TabloopServer
    history: EditHistory = field(default_factory=EditHistory)
    counters: NextEditCounters = field(default_factory=NextEditCounters)
    in_flight: dict[str, CancelToken] = field(default_factory=dict)
    ahead: dict[str, _Ahead] = field(default_factory=dict)  # by document
    # The requests in flight after Tab took a prediction (the edit after an accepted one): their
    # token (the prefetch's when they are answered from it), their model job, and the accepted
    # prediction's `_Ahead` (no longer in `ahead`).
    chained: dict[str, tuple[CancelToken, asyncio.Future[Any], _Ahead]] = field(
        default_factory=dict
    )
    answered: OrderedDict[str, Answered] = field(default_factory=OrderedDict)
    timings: deque[NextEditTiming] = field(default_factory=lambda: deque(maxlen=TIMINGS_KEPT))
    _predictor: NextEditPredictor | None = None
    # The torch bfloat16 runner (`nextEdit.engine`), the settings it was loaded with, its load.
    _runner: TorchRunner | None = None
    _runner_key: tuple[Any, ...] | None = None
    _loading: asyncio.Task[None] | None = None
    runner_error: str = ""
    # The next-edit track's serving adapter, and the registry file's stamp it was read at.
    _track_stamp: tuple[Any, ...] | None = None
    _track_adapter: Path | None = None
    _refused: Path | None = None  # an adapter the runner refused: not tried again until it changes
    track_error: str = ""
    # Reads the start of the next prediction's prompt between edits (`nextEdit.preread`).
    preread: PromptPreread = field(init=False)

    def __post_init__(self) -> None:
        self.preread = PromptPreread(self.server, self.history, self.predictor, self.adapter_server)

    @property
    def enabled(self) -> bool:
        return self.server.settings.next_edit.enabled

    def on_settings(self, settings: Settings) -> None:
        """Advertise the feature (at `initialize`) and follow the window and budget settings."""
        experimental = self.server.protocol.experimental
        section = experimental.setdefault(CONFIGURATION_SECTION, {})
        if settings.next_edit.enabled:
            section[NEXT_EDIT_CAPABILITY] = True
        else:
            section.pop(NEXT_EDIT_CAPABILITY, None)
            if not section:
                experimental.pop(CONFIGURATION_SECTION, None)
        if self._predictor is not None:
            self._predictor.settings = settings.next_edit
        if next_edit_engine(settings.next_edit, settings.completion) != "torch-bfloat16":
            self._close_runner()  # rewrites went back to the engine's runner
            self._runner_key = None
        if settings.next_edit.enabled and settings.next_edit.screen_below > 0:
            try:
                load_screen(settings.next_edit.screen_weights)
            except ScreenError as exc:  # each prediction fails with it until it is fixed
                self.server.report_problems([f"nextEdit.screenWeights: {exc}"])

    def predictor(self) -> NextEditPredictor | None:
        """The predictor on the runner `nextEdit.engine` names (None before it is loaded; the
        first call after the engine is ready starts loading a runner of its own)."""
        engine = self.server.engine
        if engine is None:
            return None
        settings = self.server.settings
        runner: ModelRunner | None = engine.runner
        if next_edit_engine(settings.next_edit, settings.completion) == "torch-bfloat16":
            runner = self._own_runner()
        if runner is None:
            return None
        if self._predictor is None or self._predictor.runner is not runner:
            self._predictor = NextEditPredictor(runner, settings.next_edit, keep=REWRITES_KEPT)
        return self._predictor

    def on_ready(self) -> None:
        """The engine is loaded: load next edits' own runner now, not at the first request."""
        if self.enabled:
            self.predictor()

    def _own_runner(self) -> TorchRunner | None:
        """The torch bfloat16 runner for the settings of now, or None while it loads (or when it
        could not be loaded: `runner_error` says why, and a settings change tries again)."""
        settings = self.server.settings
        completion = settings.completion
        key = (
            completion.model,
            str(settings.cache_path()),
            completion.fim_template,
            completion.threads,
            completion.cache,
        )
        if key == self._runner_key and (self._runner is not None or self.runner_error):
            return self._runner
        if self._loading is not None and not self._loading.done():
            return None
        self._close_runner()
        self._runner_key, self.runner_error = key, ""
        self._loading = asyncio.get_running_loop().create_task(self._load(key))
        return None

    async def _load(self, key: tuple[Any, ...]) -> None:
        settings = self.server.settings
        started = time.perf_counter()

        def load() -> Any:
            self.server.import_libraries(embeddings=False)  # not beside the index's import
            return load_next_edit_runner(settings.completion, settings.cache_path())

        try:
            # On a thread of its own: the model thread keeps answering completions meanwhile.
            runner = await asyncio.get_running_loop().run_in_executor(None, load)
        except Exception as exc:
            log.error("could not load the next-edit runner: %s", exc, exc_info=True)
            self.runner_error = str(exc)
            self.server.report_problems([f"nextEdit.engine: {exc}"])
            return
        if key != self._runner_key:  # the settings changed while it loaded
            self.server.model_executor.submit(runner.close)
            return
        self._runner = runner
        log.info(
            "next edits run on %s (torch bfloat16), loaded in %.1fs",
            runner.model_id,
            time.perf_counter() - started,
        )

    def _close_runner(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            self.server.model_executor.submit(runner.close)

    def on_shutdown(self) -> None:
        self.cancel_all("shutdown")
        self.preread.close()
        if self._loading is not None:
            self._loading.cancel()
        self._close_runner()

    def track_adapter(self) -> Path | None:
        """The adapter serving in the workspace's next-edit track (None: no version serves, or
        the completion adapter is named or the backend's, which next edits then follow too).
        The registry is read again only when its file changes."""
        settings, root = self.server.settings, self.server.workspace_root
        completion = settings.completion
        if root is None or completion.adapter or completion.adapter_source == "backend":
            return None
        registry = edit_registry(settings.cache_path(), root)
        try:
            found = (registry.root / REGISTRY_FILE).stat()
        except OSError:
            return None
        stamp = (str(registry.root), found.st_mtime_ns, found.st_size)
        if stamp != self._track_stamp:
            self._track_stamp, self._refused = stamp, None
            try:
                self._track_adapter, self.track_error = registry.serving_path(), ""
            except AdapterRegistryError as exc:
                log.warning("the next-edit adapters' registry: %s", exc)
                self._track_adapter, self.track_error = None, str(exc)
        return self._track_adapter

    def adapter_server(self, predictor: NextEditPredictor) -> Callable[[], None]:
        """What puts the adapter next edits serve now on `predictor`'s runner, on the model
        thread, before its work (nothing when it is the engine's own runner)."""
        serving = self.server.engine.runner if self.server.engine else None
        own: TorchRunner | None = self._runner if predictor.runner is self._runner else None
        track = self.track_adapter() if own is not None else None

        def serve_adapter() -> None:
            if own is not None:
                self._serve_adapter(own, track, serving)

        return serve_adapter

    def _serve_adapter(
        self, own: TorchRunner, track: Path | None, serving: ModelRunner | None
    ) -> None:
        """On the model thread: put the next-edit track's adapter on next edits' runner when it
        has one, else the engine's. A damaged adapter is refused and what served keeps serving."""
        try:
            if track is not None and track != self._refused:
                if own.adapter != track:
                    own.swap_adapter(track)
            elif track is None and serving is not None:
                follow_adapter(own, serving)
        except AdapterError as exc:
            log.warning("next edits keep their adapter: %s", exc)
            self._refused, self.track_error = track, str(exc)

    def path_of(self, uri: str) -> str:
        """The document's path as the prompt names it (and the history keys it): relative to
        the workspace when inside it, else the whole path (forward slashes), else the URI."""
        path = to_fs_path(uri)
        if not path:
            return uri
        root = self.server.workspace_root
        if root is not None:
            try:
                return Path(path).relative_to(root).as_posix()
            except ValueError:
                pass
        return Path(path).as_posix()

    # -- documents (a DocumentListener) ---------------------------------------------------

    def did_change(self, change: DocumentChange) -> None:
        uri = change.uri
        self.cancel(uri, "document changed")
        document = open_document(self.server.workspace, uri)
        ahead = self.ahead.get(uri)
        accepted = False
        if ahead is not None:
            accepted = not ahead.accepted and document is not None and ahead.lines == document.lines
            if accepted:
                ahead.accepted = True
            else:
                self.drop_ahead(uri, "the document did not become the accepted one")
        if not self.enabled or not change.edits or document is None:
            return
        record_change(self.history, self.path_of(uri), change, document.lines, new_event=accepted)
        self.preread.after_change()
        # The other documents' predictions ahead read a history this edit is not in.
        for other in [other for other in self.ahead if other != uri]:
            self.drop_ahead(other, "an edit in another document")

    def did_close(self, uri: str) -> None:
        self.cancel(uri, "document closed")
        self.drop_ahead(uri, "document closed")

    # -- requests -------------------------------------------------------------------------

    def cancel(self, uri: str, reason: str) -> None:
        token = self.in_flight.pop(uri, None)
        if token is not None:
            chained = self.chained.get(uri)
            if chained is not None and chained[0] is token and chained[2].computing:
                self.counters.prefetch_cancelled += 1  # the prefetch it waits for stops too
            token.cancel(reason)

    def cancel_all(self, reason: str) -> None:
        """Stop all model work: the predictions in flight and those computed ahead (what
        accepting them makes is still known)."""
        for uri in list(self.in_flight):
            self.cancel(uri, reason)
        for ahead in self.ahead.values():
            self._stop(ahead, reason)

    def drop_ahead(self, uri: str, reason: str) -> None:
        """Forget the prediction answered in document `uri`, and stop computing the one after it."""
        ahead = self.ahead.pop(uri, None)
        if ahead is not None:
            self._stop(ahead, reason)

    def _stop(self, ahead: _Ahead, reason: str) -> None:
        if ahead.computing:
            ahead.token.cancel(reason)  # within a decoder layer
            self.counters.prefetch_cancelled += 1

    def on_model_turn(self, kind: ModelWork) -> list[asyncio.Future[Any]]:
        """An inline completion request is about to run on the model thread: next-edit work
        stops for it, except the edit after one the user took with Tab (the prediction computed
        ahead for an accepted one, and the request after Tab, answered from it or computing its
        own), which it waits for: the user is taking a chain of edits, and a client may ask for
        an inline completion at the cursor the acceptance moved (Neovim's own inline completion
        does, unless tabloop's plugin holds it back). One answered without the model (before the
        model is ready, silenced before it, with completions off) leaves all of it running."""
        if kind != "inline":
            return []
        reason = "an inline completion request came to the model"
        self.preread.stop_for_inline()
        waits: list[asyncio.Future[Any]] = []
        for uri, token in list(self.in_flight.items()):
            chained = self.chained.get(uri)
            if chained is not None and chained[0] is token and not chained[1].done():
                waits.append(chained[1])
            else:
                self.cancel(uri, reason)
        for ahead in self.ahead.values():
            if ahead.accepted and ahead.computing and ahead.task is not None:
                waits.append(ahead.task)
            else:
                self._stop(ahead, reason)
        return waits

    async def answer(self, params: NextEditParams, request_id: str) -> NextEditResult:
        """The next-edit request's answer; whatever happens, one timing record."""
        self.counters.requests += 1
        record = _Record(request_id, time.perf_counter())
        try:
            return await self._answer(params, record)
        except asyncio.CancelledError:
            record.outcome = "cancelled"
            raise
        except Exception:
            log.exception("next edit failed")
            record.outcome = "error"
            return NextEditResult()
        finally:
            self.timings.append(record.timing())

    async def _answer(self, params: NextEditParams, record: _Record) -> NextEditResult:
        uri = params.text_document.uri
        predictor = self.predictor()
        if not self.enabled or predictor is None:
            record.outcome = "not_ready"
            return NextEditResult()
        document = open_document(self.server.workspace, uri)
        if document is None:
            record.outcome = "no_document"
            return NextEditResult()
        version = params.text_document.version
        if (document.version or 0) != version:
            record.outcome = "stale"
            return NextEditResult()
        position = document.server_position(params.position)
        cursor = (position.line, position.character)
        path = self.path_of(uri)
        lines = document.lines
        # What was computed ahead here is used when it is still being computed or done for this
        # document and the cursor's line (the window): this request waits for it on the model
        # thread, under its token, so that what stops the request stops it too. Else it stops.
        ahead = self.ahead.pop(uri, None)
        used = (
            ahead is not None
            and ahead.task is not None
            and not ahead.token.cancelled
            and ahead.lines == lines
            and ahead.cursor_line == cursor[0]
        )
        if ahead is not None and not used:
            self._stop(ahead, "superseded")
        quick = predictor.quick_answer(path, cursor, self.history)
        if quick is not None:
            # No model call, nothing to wait for: answered on the event loop.
            if ahead is not None and used:
                self._stop(ahead, "not needed")
            record.prediction = quick
            record.outcome = "no_change"
            return NextEditResult()
        token = ahead.token if ahead is not None and used else CancelToken()
        self.cancel(uri, "superseded")
        self.in_flight[uri] = token
        serve_adapter = self.adapter_server(predictor)

        def predict() -> tuple[NextEditPrediction, tuple[str, ...]]:
            serve_adapter()
            found = predictor.predict(lines, path, cursor, self.history, token)
            return found, applied(lines, found.edits) if found.edits else lines

        loop = asyncio.get_running_loop()
        self.server.completion_activity(True, "next_edit")  # background training pauses
        self.preread.stop_for_next_edit()
        future = loop.run_in_executor(self.server.model_executor, predict)
        if ahead is not None and ahead.accepted:
            # The request after Tab (the document is still the accepted one), answered from the
            # prediction computed ahead or computing its own.
            self.chained[uri] = (token, future, ahead)
        try:
            prediction, after = await future
        except Cancelled:
            record.outcome = "cancelled"
            return NextEditResult()
        except asyncio.CancelledError:
            token.cancel("cancelled by the client")  # stop the model within one decode step
            raise
        finally:
            self.server.completion_activity(False, "next_edit")
            if self.in_flight.get(uri) is token:
                del self.in_flight[uri]
            if uri in self.chained and self.chained[uri][1] is future:
                del self.chained[uri]
        record.prediction = prediction
        if prediction.timings.reused:
            self.counters.prefetch_used += used
        elif prediction.timings.reached_model:
            self.counters.model_calls += 1
        current = open_document(self.server.workspace, uri)
        if current is None or (current.version or 0) != version:
            record.outcome = "stale"
            return NextEditResult()
        if not prediction.edits:
            refused = prediction.reason in ("outside_window", "undo", "truncated")
            record.outcome = "refused" if refused else "no_change"
            return NextEditResult()
        record.outcome = "shown"
        record.edits = len(prediction.edits)
        self.counters.predicted += 1
        prediction_id = uuid.uuid4().hex
        invoked = params.context is not None and params.context.trigger_kind == 1
        answered = Answered(
            prediction_id,
            uri,
            language_of(document),
            "invoked" if invoked else "automatic",
            prediction,
            time.monotonic(),
        )
        self._remember(answered)
        self._keep_ahead(uri, prediction_id, path, lines, after, prediction, serve_adapter)
        return NextEditResult(
            [self._item(prediction_id, document, version, lines, edit) for edit in prediction.edits]
        )

    def _keep_ahead(
        self,
        uri: str,
        prediction_id: str,
        path: str,
        lines: tuple[str, ...],
        after: tuple[str, ...],
        prediction: NextEditPrediction,
        serve_adapter: Callable[[], None],
    ) -> None:
        """Keep the document accepting `prediction` makes (`after`), and with
        `nextEdit.prefetch` compute on the model thread the prediction there, so that the
        predictor keeps its rewrite for the request after Tab."""
        self.drop_ahead(uri, "superseded")
        ahead = self.ahead[uri] = _Ahead(prediction_id, after, cursor_after(prediction.edits)[0])
        predictor = self._predictor
        if not self.server.settings.next_edit.prefetch or predictor is None:
            return
        history = self.history.snapshot()
        edits, token = prediction.edits, ahead.token

        def run() -> None:
            serve_adapter()
            state = accepted_state(lines, edits, history, path)
            token.raise_if_cancelled()
            predictor.predict(state.lines, path, state.cursor, history, token, now=state.at)

        async def compute() -> None:
            self.server.completion_activity(True, "next_edit")  # background training pauses
            try:
                await asyncio.get_running_loop().run_in_executor(self.server.model_executor, run)
            except Cancelled:
                pass
            except Exception:
                log.exception("computing the next edit ahead failed")
            finally:
                self.server.completion_activity(False, "next_edit")

        self.preread.stop_for_next_edit()
        ahead.task = asyncio.get_running_loop().create_task(compute())
        self.counters.prefetch_started += 1

    def _item(
        self, prediction_id: str, document: Document, version: int, lines: Any, edit: Edit
    ) -> NextEditItem:
        encoding = document.encoding

        def position(line: int, character: int) -> types.Position:
            text = lines[line] if line < len(lines) else ""
            return types.Position(line, client_column(text, character, encoding))

        return NextEditItem(
            id=prediction_id,
            text_document=types.VersionedTextDocumentIdentifier(version=version, uri=document.uri),
            range=types.Range(
                start=position(edit.start_line, edit.start_character),
                end=position(edit.end_line, edit.end_character),
            ),
            text=edit.text,
            command=types.Command(
                title=ACCEPT_NEXT_EDIT_TITLE,
                command=ACCEPT_NEXT_EDIT_COMMAND,
                arguments=[prediction_id],
            ),
        )

    def _remember(self, answered: Answered) -> None:
        self.answered[answered.prediction_id] = answered
        while len(self.answered) > PREDICTIONS_KEPT:
            self.answered.popitem(last=False)

    # -- outcomes -------------------------------------------------------------------------

    def shown(self, prediction_id: str) -> None:
        """The editor displayed the prediction (recorded once)."""
        answered = self.answered.get(prediction_id)
        if answered is None or answered.shown_at is not None or answered.finished:
            return
        answered.shown_at = time.monotonic()
        self.counters.shown += 1
        self._event(answered, "shown")

    def accepted(self, prediction_id: str) -> None:
        """`tabloop.acceptNextEdit`: the editor applied the prediction's edits."""
        answered = self.answered.get(prediction_id)
        if answered is None or answered.finished:
            log.warning("accept for an unknown next edit %r", prediction_id)
            return
        self.shown(prediction_id)  # a client that does not say it showed it still did
        answered.finished = True
        self.counters.accepted += 1
        self._event(answered, "accepted")

    def rejected(self, prediction_id: str, reason: str) -> None:
        """`tabloop/nextEditRejected`: dismissed, typed over, or the cursor moved away."""
        answered = self.answered.get(prediction_id)
        if answered is None or answered.finished:
            return
        self.shown(prediction_id)
        answered.finished = True
        self.counters.rejected += 1
        ahead = self.ahead.get(answered.uri)
        if ahead is not None and ahead.prediction_id == prediction_id:
            self.drop_ahead(answered.uri, "the prediction was rejected")
        self._event(answered, "rejected", reason)

    def _event(self, answered: Answered, kind: NextEditKind, reason: str | None = None) -> None:
        telemetry = self.server.find_feature(TelemetryFeature)
        client = telemetry.client if telemetry is not None else None
        if client is None or client.level == "off":
            return
        prediction = answered.prediction
        window = prediction.window
        timings = prediction.timings
        full = client.level == "full"
        info = self.server.client_info
        since = answered.shown_at if kind != "shown" and answered.shown_at else None
        try:
            event = NextEditEvent(
                decision_id=answered.prediction_id,
                session_id=client.session_id,
                install_id=client.install_id,
                kind=kind,
                reason=reason,
                language=answered.language if len(answered.language) <= 64 else "other",
                trigger=answered.trigger,
                model_id=self._model_id()[:200],
                edits=min(len(prediction.edits), 1000),
                removed_chars=sum(len(e.removed) for e in prediction.edits),
                inserted_chars=sum(len(e.text) for e in prediction.edits),
                window_lines=len(window.lines) if window is not None else 0,
                latency=Latency(model_ms=timings.model_ms, total_ms=timings.total_ms),
                time_to_outcome_ms=(time.monotonic() - since) * 1000 if since else 0.0,
                client_name=info.name[:64] if info is not None else None,
                client_version=info.version[:64] if info is not None and info.version else None,
                original=window.text[:MAX_TEXT_CHARS] if full and window is not None else None,
                predicted=prediction.predicted[:MAX_TEXT_CHARS] if full else None,
            )
        except ValidationError as exc:
            log.warning("a next edit could not be made into an event: %s", exc)
            return
        client.record(event)

    def _model_id(self) -> str:
        """The model (and adapter) that writes next edits: next edits' own runner's, else the
        engine's."""
        predictor = self._predictor
        if predictor is not None and predictor.runner is self._runner and self._runner is not None:
            return self._runner.model_id
        return self.server.engine.model_id if self.server.engine else ""

    def status_parts(self) -> dict[str, Any]:
        """The `nextEdit` part of `tabloop/status`."""
        counters = self.counters
        settings = self.server.settings
        engine = next_edit_engine(settings.next_edit, settings.completion)
        runner = self._runner if engine == "torch-bfloat16" else None
        return {
            "nextEdit": {
                "enabled": self.enabled,
                # Where rewrites run: `completion` (the engine's runner) or `torch-bfloat16`,
                # with that runner's model id ("" while it loads) and its load error if any.
                "engine": engine,
                "runnerModelId": runner.model_id if runner is not None else "",
                "runnerError": self.runner_error if engine == "torch-bfloat16" else "",
                # The adapter on that runner (its directory; "" for the base model), and what
                # went wrong reading the next-edit track's registry or serving its adapter.
                "adapter": str(runner.adapter or "") if runner is not None else "",
                "trackError": self.track_error,
                "requests": counters.requests,
                "predicted": counters.predicted,
                "modelCalls": counters.model_calls,
                "shown": counters.shown,
                "accepted": counters.accepted,
                "rejected": counters.rejected,
                # Predictions computed ahead of an acceptance, used by the request after it,
                # and dropped before they were done.
                "prefetchStarted": counters.prefetch_started,
                "prefetchUsed": counters.prefetch_used,
                "prefetchCancelled": counters.prefetch_cancelled,
                # Reads of the next prompt's start between edits: started (each try), the
                # tokens of those that finished, those that found theirs kept already, and
                # those stopped before they were done (their finished passes are kept).
                "preread": self.preread.status(),
                "historyEvents": len(self.history),
            }
        }


def record_change(
    history: EditHistory,
    path: str,
    change: DocumentChange,
    lines: Sequence[str],
    *,
    new_event: bool = False,
) -> None:
    """Record the edits of one `didChange` in `history` under `path`, `lines` being the
    document's lines after them all: each edit against the lines right after it (several edits
    come from multiple cursors, or from an editor that sends a deletion and the text typed in its
    place as one notification). A whole-text change is recorded as the edit it makes (its
    `narrowed` change); one that removes or inserts more than a history block holds forgets the
    document's events instead. `new_event`: the change starts an event of its own (an accepted
    prediction), never merged into the one before."""
    for index, (edit, after) in enumerate(change.lines_after_each(lines)):
        if edit.whole:
            found = edit.narrowed
            if found is None or max(len(found.removed), len(found.text)) > history.max_event_chars:
                history.forget(path)
                continue
            edit = found
        history.record_edit(
            path,
            after,
            edit.line,
            edit.character,
            edit.removed,
            edit.text,
            new_event=new_event and index == 0,
        )


def client_column(line: str, character: int, encoding: str) -> int:
    """An LSP column in `encoding`'s code units for `character` code points into `line`."""
    prefix = line[:character]
    if encoding == types.PositionEncodingKind.Utf32 or prefix.isascii():
        return len(prefix)
    if encoding == types.PositionEncodingKind.Utf8:
        return len(prefix.encode("utf-8"))
    return len(prefix.encode("utf-16-le")) // 2


def register(server: TabloopServer) -> None:
    feature = server.add_feature(NextEditFeature(server))
    server.hooks.settings.append(feature.on_settings)
    server.hooks.documents.append(feature)
    server.hooks.model_turn.append(feature.on_model_turn)
    server.hooks.ready.append(feature.on_ready)
    server.hooks.shutdown.append(feature.on_shutdown)

    async def next_edit(ls: TabloopServer, params: Any) -> Any:
        request_id = str(ls.protocol.msg_id or "")
        parsed = read_params(params, NextEditParams)
        result = NextEditResult() if parsed is None else await feature.answer(parsed, request_id)
        # Spelled out: the converter leaves out fields at their default, and `[]` must be sent.
        return {"edits": [to_wire(item) for item in result.edits]}

    server.feature(NEXT_EDIT_REQUEST)(next_edit)
    server.feature(TABLOOP_NEXT_EDIT_REQUEST)(next_edit)

    def did_show(ls: TabloopServer, params: Any) -> None:
        shown = read_params(params, NextEditShownParams)
        if shown is not None:
            feature.shown(shown.item.id)

    server.feature(DID_SHOW_INLINE_EDIT_NOTIFICATION)(did_show)
    server.feature(NEXT_EDIT_SHOWN_NOTIFICATION)(did_show)

    @server.feature(NEXT_EDIT_REJECTED_NOTIFICATION)
    def rejected(ls: TabloopServer, params: Any) -> None:
        found = read_params(params, NextEditRejectedParams)
        if found is not None:
            feature.rejected(found.id, found.reason)

    @server.command(ACCEPT_NEXT_EDIT_COMMAND)
    def accept(ls: TabloopServer, *args: Any) -> None:
        """The editor applied a prediction; arguments: [id]."""
        arguments = list(args[0]) if len(args) == 1 and isinstance(args[0], list) else list(args)
        feature.accepted(str(arguments[0]) if arguments else "")

    @server.feature(NEXT_EDIT_TIMINGS_REQUEST)
    def timings(ls: TabloopServer, params: Any) -> list[NextEditTiming]:
        """Recent next-edit request timings, oldest first (for benchmarks)."""
        return list(feature.timings)
