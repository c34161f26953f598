"""`POST /v1/completions`: OpenAI-compatible completions from the model the LSP would run.

Several editors on one machine (or a team on one box) share one loaded model: point each
language server's `HttpRunner` here (`completion.runner = "http"`, `completion.httpUrl =
http://127.0.0.1:8765/v1`, `completion.httpApiKey = <tenant token>`). The runner comes from
`completion.runners.load_runner` with the backend's completion settings, loaded on the first
request (or at start with `preload`), and generates one request at a time.

Supported fields: `prompt` (a string, or a list of one), `max_tokens`, `temperature`, `stop` (up to
four strings), `stream` (server-sent events, ended by `data: [DONE]`), `logprobs`, `model`
(echoed, not used to pick weights), `n` (1 only). Streamed text never contains a stop sequence,
not even part of one: text that could begin one is held back until it cannot. With `logprobs`,
token log-probabilities come with the final event (the model's decode loop reports them at the
end).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import platformdirs
from fastapi import APIRouter, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.concurrency import run_in_threadpool

from backend.auth import CurrentPrincipal
from backend.routes.events import read_body
from backend.routes.index_sync import validation_detail
from completion.fim import UnknownFamily, template_for
from completion.runners.base import ModelRunner
from completion.settings import CompletionSettings
from completion.types import CancelToken, Generation

log = logging.getLogger(__name__)
router = APIRouter()

MAX_BODY_BYTES = 1024 * 1024
MAX_PROMPT_CHARS = 256 * 1024
MAX_STOP_CHARS = 64

RunnerLoader = Callable[[CompletionSettings, Path], ModelRunner]


class CompletionBody(BaseModel):
    """The request; unknown OpenAI fields (`user`, `top_p`, ...) are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")

    prompt: str | list[str]
    model: str = Field("", max_length=256)
    max_tokens: int = Field(16, ge=1, le=4096)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    stop: str | list[str] | None = None
    stream: bool = False
    logprobs: int | None = Field(None, ge=0, le=5)
    n: int = Field(1, ge=1, le=1)
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, value: str | list[str]) -> str | list[str]:
        prompts = [value] if isinstance(value, str) else value
        if len(prompts) != 1:
            raise ValueError("exactly one prompt is supported")
        if len(prompts[0]) > MAX_PROMPT_CHARS:
            raise ValueError(f"the prompt is over {MAX_PROMPT_CHARS} characters")
        return value

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > 4 or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"at most 4 stop sequences of at most {MAX_STOP_CHARS} characters")
        return value

    @property
    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    @property
    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return [s for s in stops if s]


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
        with self._lock:
            if self._runner is not None:
                self._runner.close()
                self._runner = None


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


def _finish(generation: Generation) -> str:
    return "length" if generation.stop_reason == "length" else "stop"


def _choice(text: str, finish: str | None, logprobs: list[float] | None) -> dict[str, Any]:
    return {
        "index": 0,
        "text": text,
        "finish_reason": finish,
        "logprobs": None if logprobs is None else {"token_logprobs": logprobs},
    }


def _usage(generation: Generation) -> dict[str, int]:
    return {
        "prompt_tokens": generation.prompt_tokens,
        "completion_tokens": generation.new_tokens,
        "total_tokens": generation.prompt_tokens + generation.new_tokens,
    }


async def _parse(request: Request) -> CompletionBody:
    body = await read_body(request, MAX_BODY_BYTES)
    try:
        return CompletionBody.model_validate_json(body)
    except ValidationError as exc:
        status = 400 if exc.errors()[0]["type"] == "json_invalid" else 422
        raise HTTPException(status, detail=validation_detail(exc)) from exc


@router.post("/v1/completions")
async def completions(request: Request, principal: CurrentPrincipal) -> Any:
    """Complete a prompt with the shared model, whole or streamed."""
    ask = await _parse(request)
    service: CompletionService = request.app.state.completions
    try:
        runner = await run_in_threadpool(service.runner)
    except Exception as exc:
        raise HTTPException(503, detail=f"the completion model is not available: {exc}") from exc
    ident = f"cmpl-{uuid.uuid4().hex}"
    head = {"id": ident, "object": "text_completion", "created": int(time.time())}
    head["model"] = ask.model or runner.model_id
    if not ask.stream:
        generation = await run_in_threadpool(_generate, runner, ask, CancelToken(), None)
        logprobs = generation.token_logprobs if ask.logprobs is not None else None
        text = (ask.text if ask.echo else "") + generation.text
        return JSONResponse(
            {
                **head,
                "choices": [_choice(text, _finish(generation), logprobs)],
                "usage": _usage(generation),
            }
        )
    return StreamingResponse(_stream(runner, ask, head), media_type="text/event-stream")


def _generate(
    runner: ModelRunner,
    ask: CompletionBody,
    cancel: CancelToken,
    emit: Callable[[str], None] | None,
) -> Generation:
    """Run the model; `emit` receives each piece of text that can no longer be retracted."""
    # The model's own end markers are cut by the runner too; held back here, they never stream.
    stops = ask.stops + [s for s in _template_stops(runner) if s not in ask.stops]
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
        ask.text,
        max_new_tokens=ask.max_tokens,
        stop=stop_rule,
        cancel=cancel,
        temperature=ask.temperature,
    )
    if emit is not None and len(generation.text) > sent:
        emit(generation.text[sent:])  # what was held back and turned out not to be a stop
    return generation


def _template_stops(runner: ModelRunner) -> list[str]:
    try:
        return list(template_for(runner.family).stop_tokens)
    except UnknownFamily:
        return []


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def _stream(
    runner: ModelRunner, ask: CompletionBody, head: dict[str, Any]
) -> AsyncIterator[str]:
    """Generate in a worker thread and forward each piece as one event; a client that goes
    away cancels the generation within one decode step."""
    pieces: queue.Queue[tuple[str, Any] | None] = queue.Queue()
    cancel = CancelToken()

    def work() -> None:
        try:
            generation = _generate(runner, ask, cancel, lambda text: pieces.put(("text", text)))
            pieces.put(("end", generation))
        except Exception as exc:
            log.exception("completion failed")
            pieces.put(("error", f"{type(exc).__name__}: {exc}"))
        finally:
            pieces.put(None)

    thread = threading.Thread(target=work, name="tabloop-completion", daemon=True)
    thread.start()
    try:
        if ask.echo:
            yield _event({**head, "choices": [_choice(ask.text, None, None)]})
        while (item := await asyncio.to_thread(pieces.get)) is not None:
            kind, value = item
            if kind == "text":
                yield _event({**head, "choices": [_choice(value, None, None)]})
            elif kind == "error":
                yield _event({**head, "error": {"message": value, "type": "server_error"}})
            else:
                logprobs = value.token_logprobs if ask.logprobs is not None else None
                yield _event(
                    {
                        **head,
                        "choices": [_choice("", _finish(value), logprobs)],
                        "usage": _usage(value),
                    }
                )
        yield "data: [DONE]\n\n"
    finally:
        if thread.is_alive():
            cancel.cancel("client disconnected")


def default_cache_dir() -> Path:
    return platformdirs.user_cache_path("tabloop")


def configure(
    app: FastAPI,
    settings: CompletionSettings | None = None,
    cache_dir: Path | None = None,
    *,
    preload: bool = False,
    loader: RunnerLoader | None = None,
) -> CompletionService:
    """Serve completions on `app` with these settings (default: the bundled model, loaded on
    first use; `preload` starts loading now)."""
    previous: CompletionService | None = getattr(app.state, "completions", None)
    if previous is not None:
        previous.close()
    service = CompletionService(
        settings or CompletionSettings(), cache_dir or default_cache_dir(), loader
    )
    app.state.completions = service
    if preload:
        service.preload()
    return service


def install(app: FastAPI) -> None:
    """Add the route with the default (lazily loaded) service."""
    configure(app)
    app.include_router(router)
