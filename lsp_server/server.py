"""The tabloop language server: the only home of server state.

Feature modules (`lsp_server/features/*.py`) register handlers on a `TabloopServer` and talk to
each other through the hooks below, so one feature never needs to own another's LSP method. A
feature that needs another asks for it by its class: `server.feature_of(IndexFeature)`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal, Protocol, TypeVar, runtime_checkable

from lsprotocol import types
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer

from completion.types import CancelToken, CompletionRequest, Decision
from lsp_server import __version__, config
from lsp_server.capabilities import ResolvedClientCapabilities
from lsp_server.documents import DocumentListener
from lsp_server.framing import CHUNK_BYTES, ChunkSource, serve_frames
from lsp_server.protocol import RequestTiming, ServerStatus
from lsp_server.rpc import TabloopProtocol

if TYPE_CHECKING:
    from completion.engine import Engine
    from telemetry.events import OutcomeEvent, RetentionEvent

log = logging.getLogger(__name__)

ModelState = Literal["disabled", "loading", "ready", "error"]
FeatureT = TypeVar("FeatureT")
ModelWork = Literal["inline", "next_edit"]  # what a request wants the model for

DECISIONS_KEPT = 2048
TIMINGS_KEPT = 1024


@runtime_checkable
class StatusReporter(Protocol):
    """A feature with parts of its own in `tabloop/status` (e.g. `index`, `context`)."""

    def status_parts(self) -> dict[str, Any]: ...


@dataclass
class Hooks:
    """Extension points between features. Callbacks run on the event loop and must not block."""

    decision: list[Callable[[Decision, CompletionRequest], None]] = field(default_factory=list)
    # A request that wants the model began (True) or its handler ended (False), however it
    # ended, and its kind: `inline` (a completion) or `next_edit`.
    completion: list[Callable[[bool, ModelWork], None]] = field(default_factory=list)
    # A request of this kind is about to run on the model thread (one answered without it never
    # gets here): a hook stops the work that yields to it and returns the work it waits for
    # instead (`TabloopServer.model_turn`).
    model_turn: list[Callable[[ModelWork], Collection[asyncio.Future[Any]]]] = field(
        default_factory=list
    )
    accept: list[Callable[[str, list[Any]], None]] = field(default_factory=list)
    outcome: list[Callable[[OutcomeEvent], None]] = field(default_factory=list)
    retention: list[Callable[[RetentionEvent], None]] = field(default_factory=list)
    # (decision id, the text kept in place of an accepted suggestion at its first retention
    # checkpoint: `lsp_server.outcomes`).
    kept: list[Callable[[str, str], None]] = field(default_factory=list)
    documents: list[DocumentListener] = field(default_factory=list)
    settings: list[Callable[[config.Settings], None]] = field(default_factory=list)
    ready: list[Callable[[], None]] = field(default_factory=list)
    shutdown: list[Callable[[], None]] = field(default_factory=list)


class ModelThread(ThreadPoolExecutor):
    """The model thread: one job at a time, counting those queued or running (`jobs`, in
    `tabloop/status` as `model.jobs`: 0 when the model is idle)."""

    def __init__(self) -> None:
        super().__init__(1, thread_name_prefix="tabloop-model")
        self._lock = threading.Lock()
        self._jobs = 0

    @property
    def jobs(self) -> int:
        return self._jobs

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        def run() -> Any:
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self._jobs -= 1

        with self._lock:
            self._jobs += 1
        try:
            return super().submit(run)
        except BaseException:
            with self._lock:
                self._jobs -= 1
            raise


@dataclass
class DecisionRecord:
    """A decision the server answered with, kept so the accept command can find it."""

    decision: Decision
    request: CompletionRequest
    answered_at: float


@dataclass
class Counters:
    requests: int = 0
    shown: int = 0
    silenced: int = 0
    accepted: int = 0
    cancelled: int = 0
    stale: int = 0


class TabloopServer(LanguageServer):
    """Language server state: settings, the engine, in-flight requests, recent decisions."""

    def __init__(self) -> None:
        super().__init__("tabloop", __version__, protocol_cls=TabloopProtocol)
        self.resolved: config.Resolved = config.resolve(None)
        self.workspace_root: Path | None = None
        self.init_options: Any = None
        # The editor's name and version from `initialize` (`clientInfo`), put on decision events.
        self.client_info: types.ClientInfo | None = None
        # What the client can do, resolved once at `initialize`.
        self.client = ResolvedClientCapabilities()
        self.client_config: Any = None
        self.engine: Engine | None = None
        self._import_lock = threading.Lock()
        self.model_state: ModelState = "loading"
        self.model_error = ""
        # Model work runs here, one call at a time, never on the event loop.
        self.model_executor = ModelThread()
        self.in_flight: dict[str, CancelToken] = {}
        self.decisions: OrderedDict[str, DecisionRecord] = OrderedDict()
        self.hooks = Hooks()
        self.counters = Counters()
        # Per answered request: wall time in the handler and in the model, the action and why.
        self.request_timings: deque[RequestTiming] = deque(maxlen=TIMINGS_KEPT)
        self.engine_ready = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._reported_problems: set[str] = set()
        # Feature objects by class, in registration order (which is also their order in status).
        self._features: dict[type, object] = {}

    protocol: TabloopProtocol

    @property
    def settings(self) -> config.Settings:
        return self.resolved.settings

    def start_io(self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
        """Serve one client over stdin/stdout with our frame reader (see `lsp_server.framing`)."""
        self._stop_event = threading.Event()
        self.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
        try:
            asyncio.run(self._serve_stdin(stdin or sys.stdin.buffer))
        except BrokenPipeError:
            log.error("the client's end of the connection closed; stopping")
        except (KeyboardInterrupt, SystemExit):
            pass  # `exit` ends the process this way, as under pygls's own start_io
        finally:
            self.shutdown()

    def start_tcp(self, host: str, port: int) -> None:
        """Serve one client at a time over TCP with our frame reader."""
        self._stop_event = threading.Event()

        async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.protocol.set_writer(writer)  # pygls passes the StreamWriter the same way
            await self._serve(lambda: reader.read(CHUNK_BYTES))
            self.shutdown()

        async def listen() -> None:
            self._server = await asyncio.start_server(connection, host, port)
            async with self._server:
                await self._server.serve_forever()

        try:
            asyncio.run(listen())
        except asyncio.CancelledError:
            log.debug("the TCP server was cancelled")

    async def _serve_stdin(self, stdin: BinaryIO) -> None:
        await self._serve(stdin_chunks(stdin))

    async def _serve(self, read_chunk: ChunkSource) -> None:
        stop = self._stop_event
        await serve_frames(
            read_chunk,
            lambda: self.settings.max_message_bytes,
            self.protocol.receive,
            self.protocol.refuse,
            lambda: stop is not None and stop.is_set(),
        )

    def add_feature(self, feature: FeatureT) -> FeatureT:
        """Make a feature object findable by its class; one object per class."""
        kind = type(feature)
        if kind in self._features:
            raise ValueError(f"a {kind.__name__} is registered already")
        self._features[kind] = feature
        return feature

    def find_feature(self, kind: type[FeatureT]) -> FeatureT | None:
        """The registered feature of class `kind` (or a subclass), None when there is none."""
        found = self._features.get(kind)
        if found is None:
            found = next((f for f in self._features.values() if isinstance(f, kind)), None)
        return found if isinstance(found, kind) else None

    def feature_of(self, kind: type[FeatureT]) -> FeatureT:
        """The registered feature of class `kind`; a missing one is a wiring bug (LookupError)."""
        found = self.find_feature(kind)
        if found is None:
            raise LookupError(f"no {kind.__name__} is registered")
        return found

    def run_task(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Start a background task, keep a reference, and log its failure."""
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)

        def done(finished: asyncio.Task[Any]) -> None:
            self._tasks.discard(finished)
            if not finished.cancelled() and (exc := finished.exception()) is not None:
                log.error("background task %s failed", name, exc_info=exc)

        task.add_done_callback(done)
        return task

    def import_libraries(self, *, embeddings: bool = True) -> None:
        """Import transformers (and sentence-transformers), once, one thread at a time.

        The model and the index load on two threads at once, and transformers' lazily loaded
        modules are not safe to import from two threads concurrently ("cannot import name
        AutoModelForCausalLM"). Each loader that needs them calls this first; the second one
        waits. The fast engine needs neither (nor torch): its loader does not call this, and a
        server with the index off never holds them in memory.
        """
        with self._import_lock:
            try:
                if embeddings:
                    import sentence_transformers  # noqa: F401
                import transformers

                transformers.AutoModelForCausalLM  # noqa: B018 - resolve the lazy attribute
                transformers.AutoTokenizer  # noqa: B018
            except Exception:
                log.debug("could not import the model libraries", exc_info=True)

    def resolve_settings(self) -> config.Resolved:
        """Re-resolve every configuration layer and tell the features what changed."""
        self.resolved = config.resolve(
            self.workspace_root,
            init_options=self.init_options,
            client_config=self.client_config,
        )
        self.report_problems(self.resolved.problems)
        for hook in self.hooks.settings:
            hook(self.settings)
        return self.resolved

    def report_problems(self, problems: list[str]) -> None:
        """Configuration problems: logged each time, shown to the user once each."""
        fresh = [p for p in problems if p not in self._reported_problems]
        for problem in problems:
            log.warning("configuration: %s", problem)
        if fresh:
            self._reported_problems.update(fresh)
            self.show_message(
                "tabloop configuration: " + "; ".join(fresh), types.MessageType.Warning
            )

    def show_message(self, message: str, kind: types.MessageType) -> None:
        """`window/showMessage`: only for what the user must act on."""
        try:
            self.window_show_message(types.ShowMessageParams(type=kind, message=message))
        except Exception:  # no client connected (CLI use)
            log.debug("could not show message", exc_info=True)

    def begin_request(self, uri: str) -> CancelToken:
        """A cancel token for a new request on `uri`; the previous one there is superseded."""
        self.cancel_in_flight(uri, "superseded")
        token = CancelToken()
        self.in_flight[uri] = token
        return token

    def cancel_in_flight(self, uri: str, reason: str) -> None:
        """Stop the request in flight on `uri`, if any: its model work ends within one step."""
        token = self.in_flight.pop(uri, None)
        if token is not None:
            token.cancel(reason)

    def end_request(self, uri: str, token: CancelToken) -> None:
        if self.in_flight.get(uri) is token:
            del self.in_flight[uri]

    def completion_activity(self, active: bool, kind: ModelWork = "inline") -> None:
        """A request of `kind` that wants the model began (`active`) or ended: the `completion`
        hooks hear it."""
        for hook in self.hooks.completion:
            try:
                hook(active, kind)
            except Exception:
                log.exception("completion hook failed")

    async def model_turn(self, kind: ModelWork) -> bool:
        """A request of `kind` is about to run on the model thread: the `model_turn` hooks stop
        what yields to it, and it waits for what they say it should not overtake, asking again
        after each wait (work started meanwhile yields too), so that the last ask comes right
        before the request takes its turn. Whether it waited (the document may have changed)."""
        waited = False
        while True:
            waits: list[asyncio.Future[Any]] = []
            for hook in self.hooks.model_turn:
                try:
                    waits.extend(hook(kind))
                except Exception:
                    log.exception("model turn hook failed")
            if not waits:
                return waited
            await asyncio.wait(waits)  # a cancelled request leaves them running
            waited = True

    def remember(self, decision: Decision, request: CompletionRequest) -> None:
        """Keep a decision for the accept command and tell the features."""
        now = time.monotonic()
        for candidate in [decision, *decision.alternatives]:
            self.decisions[candidate.decision_id] = DecisionRecord(candidate, request, now)
        while len(self.decisions) > DECISIONS_KEPT:
            self.decisions.popitem(last=False)
        if decision.shown:
            self.counters.shown += 1
        else:
            self.counters.silenced += 1
        for hook in self.hooks.decision:
            try:
                hook(decision, request)
            except Exception:
                log.exception("decision hook failed")

    def status(self) -> ServerStatus:
        """What `tabloop/status` answers and `tabloop doctor` prints."""
        engine = self.engine
        status: ServerStatus = {
            "version": __version__,
            "model": {
                "state": self.model_state,
                "modelId": engine.model_id if engine else "",
                "error": self.model_error,
                "calls": engine.model_calls if engine else 0,
                "prefillTokens": engine.prefill_tokens if engine else 0,
                "typingCacheHits": engine.cache.hits if engine else 0,
                "jobs": self.model_executor.jobs,
            },
            "policy": {"version": self.policy_version()},
            "telemetry": {"level": self.settings.telemetry.level},
            "decisions": {
                "requests": self.counters.requests,
                "shown": self.counters.shown,
                "silenced": self.counters.silenced,
                "accepted": self.counters.accepted,
                "cancelled": self.counters.cancelled,
                "stale": self.counters.stale,
            },
        }
        for feature in self._features.values():
            if isinstance(feature, StatusReporter):
                status.update(feature.status_parts())  # type: ignore[typeddict-item]
        return status

    def policy_version(self) -> str:
        engine = self.engine
        return engine.policy_source().version if engine else ""

    async def shutdown_features(self) -> None:
        for hook in self.hooks.shutdown:
            try:
                hook()
            except Exception:
                log.exception("shutdown hook failed")
        for token in self.in_flight.values():
            token.cancel("shutdown")
        engine, self.engine = self.engine, None
        if engine is not None:
            await asyncio.get_running_loop().run_in_executor(self.model_executor, engine.close)


def stdin_chunks(stdin: BinaryIO) -> ChunkSource:
    """Read stdin on a thread of its own; the returned coroutine function gives each chunk.

    The queue is short, so the thread waits while the event loop is behind: a client that
    floods the server is held back by the pipe instead of filling memory.
    """
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[bytes] = asyncio.Queue(maxsize=16)
    read: Callable[[int], bytes]
    try:
        fd = stdin.fileno()
        # Unbuffered: a daemon thread blocked inside a BufferedReader holds its lock, and the
        # interpreter aborts at exit when it cannot take that lock.
        read = functools.partial(os.read, fd)
    except (AttributeError, OSError, ValueError):
        read = getattr(stdin, "read1", stdin.read)  # an in-memory stream, as tests pass

    def pump() -> None:
        while True:
            try:
                chunk = read(CHUNK_BYTES)
            except (OSError, ValueError):
                chunk = b""  # a closed stdin ends the stream like EOF
            try:
                asyncio.run_coroutine_threadsafe(chunks.put(chunk), loop).result()
            except RuntimeError:
                return  # the loop is gone
            if not chunk:
                return

    threading.Thread(target=pump, name="tabloop-stdin", daemon=True).start()
    return chunks.get
