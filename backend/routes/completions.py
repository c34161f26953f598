"""`POST /v1/completions`: OpenAI-compatible completions from the model the LSP would run.

Several editors on one machine (or a team on one box) share one loaded model: point each
language server's `HttpRunner` here (`completion.runner = "http"`, `completion.httpUrl =
http://127.0.0.1:8765/v1`, `completion.httpApiKey = <tenant token>`). The model is the app's
`CompletionService` (`backend/services/completions.py`): loaded on the first request (or at
start with `preload`), it generates one request at a time.

Supported fields: `prompt` (a string, or a list of one), `max_tokens`, `temperature`, `stop` (up to
four strings), `stream` (server-sent events, ended by `data: [DONE]`), `logprobs`, `model`
(echoed, not used to pick weights), `n` (1 only), `user` (the installation's id, as its events
carry it: it puts the client on an adapter canary's arm). Streamed text never contains a stop
sequence, not even part of one: text that could begin one is held back until it cannot. With
`logprobs`, token log-probabilities come with the final event (the model's decode loop reports
them at the end).

With `lora_upstream.url` set, the backend runs no model: each request goes to that multi-LoRA
server (vLLM) with `model` set to the name under which the tenant's adapter version is loaded
there (`backend/services/lora_upstream.py`; the client's `model` never picks it), and the answer
comes back as the server wrote it, streamed or whole. `X-Tabloop-Model-Version` names the version
that wrote it (`base` for the base model), `X-Tabloop-Adapter-Arm` the client's arm, and
`X-Tabloop-Adapter-Fallback` says why the base model wrote it when the tenant has an adapter that
could not be served.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import httpx
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool

from backend.auth import CurrentPrincipal
from backend.deps import CompletionServiceDep, Services
from backend.routes.body import json_body_openapi, read_json_body
from backend.routes.index_sync import validation_detail
from backend.routes.model import MODEL_VERSION_HEADER
from backend.services.completions import CompletionJob, CompletionService, StreamFailure
from backend.services.lora_upstream import LoraUpstream, UpstreamRoute, UpstreamUnavailable
from completion.runners.base import ModelRunner
from completion.types import CancelToken, Generation

router = APIRouter()

MAX_BODY_BYTES = 1024 * 1024
MAX_PROMPT_CHARS = 256 * 1024
MAX_STOP_CHARS = 64
ARM_HEADER = "X-Tabloop-Adapter-Arm"
FALLBACK_HEADER = "X-Tabloop-Adapter-Fallback"
INSTALL_ID = re.compile(r"[A-Za-z0-9_.:+#/-]{1,128}")
"""An installation's id as `GET /v1/model?install_id=` takes it; another `user` is no id."""
_UPSTREAM_ERROR_CHARS = 500


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
    user: str | None = Field(None, max_length=256)

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

    @property
    def install_id(self) -> str | None:
        """The asking installation's id (`user`), when it is one."""
        return self.user if self.user and INSTALL_ID.fullmatch(self.user) else None

    def upstream_payload(self) -> dict[str, Any]:
        """The request as the multi-LoRA server is sent it (its `model` is set there)."""
        payload: dict[str, Any] = {
            "prompt": self.text,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "stream": self.stream,
            "echo": self.echo,
            "n": 1,
        }
        if self.stops:
            payload["stop"] = self.stops
        if self.logprobs is not None:
            payload["logprobs"] = self.logprobs
        return payload


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
    request: Request, principal: CurrentPrincipal, service: CompletionServiceDep, services: Services
) -> Any:
    """Complete a prompt with the shared model (or the tenant's adapter on the multi-LoRA
    server), whole or streamed."""
    ask = await _parse(request)
    if services.lora_upstream is not None:
        return await _upstream(services.lora_upstream, principal.tenant, ask)
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


async def _upstream(upstream: LoraUpstream, tenant: str, ask: CompletionBody) -> Response:
    """The request answered by the multi-LoRA server, with the tenant's adapter named."""
    try:
        route, answer = await run_in_threadpool(
            upstream.open_completion, tenant, ask.install_id, ask.upstream_payload()
        )
    except UpstreamUnavailable as exc:
        raise HTTPException(503, detail=str(exc)) from None
    headers = _route_headers(route)
    if answer.status_code != 200 or not ask.stream:
        try:
            body = await run_in_threadpool(answer.read)
        finally:
            await run_in_threadpool(answer.close)
        if answer.status_code != 200:
            text = body.decode("utf-8", "replace")[:_UPSTREAM_ERROR_CHARS]
            raise HTTPException(
                502,
                detail=f"the completion server answered HTTP {answer.status_code}: {text}",
                headers=headers,
            )
        return Response(body, media_type="application/json", headers=headers)
    return StreamingResponse(_relay(answer), media_type="text/event-stream", headers=headers)


def _route_headers(route: UpstreamRoute) -> dict[str, str]:
    headers = {MODEL_VERSION_HEADER: route.version, ARM_HEADER: route.arm}
    if route.fallback is not None:
        # One line of Latin-1, as header values must be: anything else in the reason is replaced.
        reason = " ".join(route.fallback.split())
        headers[FALLBACK_HEADER] = reason.encode("latin-1", "replace").decode("latin-1")
    return headers


async def _relay(answer: httpx.Response) -> AsyncIterator[bytes]:
    """The upstream's server-sent events as they come; a break is told as an error event."""
    try:
        async for chunk in iterate_in_threadpool(answer.iter_bytes()):
            yield chunk
    except httpx.HTTPError as exc:
        failure = {"error": {"message": f"the completion server broke off: {exc}"}}
        yield f"data: {json.dumps(failure)}\n\ndata: [DONE]\n\n".encode()
    finally:
        # Closing the upstream's stream makes it stop generating for a client that left.
        await run_in_threadpool(answer.close)
