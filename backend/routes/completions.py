"""`POST /v1/completions`: OpenAI-compatible completions from the model the LSP would run.

Several editors on one machine (or a team on one box) share one loaded model: point each
language server's `HttpRunner` here (`completion.runner = "http"`, `completion.httpUrl =
http://127.0.0.1:8765/v1`, `completion.httpApiKey = <tenant token>`). The model is the app's
`CompletionService` (`backend/services/completions.py`): loaded on the first request (or at
start with `preload`), it generates one request at a time.

Supported fields: `prompt` (a string, or a list of one), `max_tokens`, `temperature`, `stop` (up to
four strings), `stream` (server-sent events, ended by `data: [DONE]`), `logprobs`, `model`
(echoed, not used to pick weights), `n` (1 only). Streamed text never contains a stop sequence,
not even part of one: text that could begin one is held back until it cannot. With `logprobs`,
token log-probabilities come with the final event (the model's decode loop reports them at the
end).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.concurrency import run_in_threadpool

from backend.auth import CurrentPrincipal
from backend.deps import CompletionServiceDep
from backend.routes.body import json_body_openapi, read_json_body
from backend.routes.index_sync import validation_detail
from backend.services.completions import CompletionJob, CompletionService, StreamFailure
from completion.runners.base import ModelRunner
from completion.types import CancelToken, Generation

router = APIRouter()

MAX_BODY_BYTES = 1024 * 1024
MAX_PROMPT_CHARS = 256 * 1024
MAX_STOP_CHARS = 64


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

    def job(self) -> CompletionJob:
        """What the model is asked to generate."""
        return CompletionJob(self.text, self.max_tokens, self.temperature, self.stops)


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
    body = await read_json_body(request, MAX_BODY_BYTES)
    try:
        return CompletionBody.model_validate_json(body)
    except ValidationError as exc:
        status = 400 if exc.errors()[0]["type"] == "json_invalid" else 422
        raise HTTPException(status, detail=validation_detail(exc)) from exc


@router.post("/v1/completions", openapi_extra=json_body_openapi(CompletionBody))
async def completions(
    request: Request, principal: CurrentPrincipal, service: CompletionServiceDep
) -> Any:
    """Complete a prompt with the shared model, whole or streamed."""
    ask = await _parse(request)
    try:
        runner = await run_in_threadpool(service.runner)
    except Exception as exc:
        raise HTTPException(503, detail=f"the completion model is not available: {exc}") from exc
    ident = f"cmpl-{uuid.uuid4().hex}"
    head = {"id": ident, "object": "text_completion", "created": int(time.time())}
    head["model"] = ask.model or runner.model_id
    if not ask.stream:
        generation = await run_in_threadpool(service.generate, runner, ask.job(), CancelToken())
        logprobs = generation.token_logprobs if ask.logprobs is not None else None
        text = (ask.text if ask.echo else "") + generation.text
        return JSONResponse(
            {
                **head,
                "choices": [_choice(text, _finish(generation), logprobs)],
                "usage": _usage(generation),
            }
        )
    return StreamingResponse(_stream(service, runner, ask, head), media_type="text/event-stream")


def _event(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload)}\n\n"


async def _stream(
    service: CompletionService, runner: ModelRunner, ask: CompletionBody, head: dict[str, Any]
) -> AsyncIterator[str]:
    """One server-sent event per piece of text, then the finish (or the error) and `[DONE]`."""
    if ask.echo:
        yield _event({**head, "choices": [_choice(ask.text, None, None)]})
    # Closed at once when the client leaves, which cancels the generation.
    async with aclosing(service.stream(runner, ask.job())) as items:
        async for item in items:
            if isinstance(item, str):
                yield _event({**head, "choices": [_choice(item, None, None)]})
            elif isinstance(item, StreamFailure):
                yield _event({**head, "error": {"message": item.message, "type": "server_error"}})
            else:
                logprobs = item.token_logprobs if ask.logprobs is not None else None
                yield _event(
                    {
                        **head,
                        "choices": [_choice("", _finish(item), logprobs)],
                        "usage": _usage(item),
                    }
                )
    yield "data: [DONE]\n\n"
