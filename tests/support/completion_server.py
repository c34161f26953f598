"""A real OpenAI-compatible `/v1/completions` server on loopback, for tests.

It serves any runner (the tiny model's `TorchRunner`, or a `ScriptedModel` whose answers the test
chooses) with SSE streaming, and can misbehave on request the ways real servers do: answer late,
stall between chunks, or die in the middle of a stream.

Run as a program (`python -m tests.support.completion_server --script FILE`) it serves a
`ScriptedModel` read from a JSON file (`{"rules": {...}, "default": "...", "token_delay_s": 0}`),
prints its base URL on the first line of stdout, and stops when stdin closes: this is how
tests outside Python (the VS Code smoke test) get a model whose answers they know.
"""

from __future__ import annotations

import asyncio
import json
import queue
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from completion.runners.base import ModelRunner
from completion.types import CancelToken
from tests.support.scripted_model import ScriptedModel


@dataclass
class Faults:
    """How the server misbehaves; tests change these between requests."""

    delay_before_headers_s: float = 0.0
    stall_between_chunks_s: float = 0.0
    die_after_chunks: int | None = None
    status: int = 200


@dataclass
class ServerState:
    runner: ModelRunner
    faults: Faults = field(default_factory=Faults)
    requests: list[dict[str, Any]] = field(default_factory=list)
    cancelled: threading.Event = field(default_factory=threading.Event)
    closing: threading.Event = field(default_factory=threading.Event)
    generate_lock: threading.Lock = field(default_factory=threading.Lock)
    headers: dict[str, str] = field(default_factory=dict)  # sent with every streamed answer


class ServerDied(Exception):
    """Raised inside the stream to drop the connection like a crashed server."""


def _event(text: str, logprob: float | None, finish: str | None) -> str:
    choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": finish}
    if logprob is not None:
        choice["logprobs"] = {"token_logprobs": [logprob]}
    return "data: " + json.dumps({"object": "text_completion", "choices": [choice]}) + "\n\n"


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        state.requests.append(body)
        faults = state.faults
        deadline = time.monotonic() + faults.delay_before_headers_s
        # Sleep in slices so that stopping the server does not wait for a slow answer.
        while time.monotonic() < deadline and not state.closing.is_set():
            await asyncio.sleep(0.05)
        if faults.status != 200:
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=faults.status)
        return StreamingResponse(
            _stream(state, body), media_type="text/event-stream", headers=dict(state.headers)
        )

    return app


async def _stream(state: ServerState, body: dict[str, Any]) -> AsyncIterator[str]:
    """Run the model in a thread and forward each new piece of text as one SSE event."""
    # ("text", piece) for generated text, ("end", stop reason) once, then None.
    pieces: queue.Queue[tuple[str, str] | None] = queue.Queue()
    cancel = CancelToken()
    client_gone = threading.Event()
    stops = [s for s in body.get("stop") or [] if s]
    sent = 0

    def on_step(text: str) -> int | None:
        nonlocal sent
        if sent and state.faults.stall_between_chunks_s:
            # A slow model: the next token comes late (or never, if the client leaves).
            client_gone.wait(state.faults.stall_between_chunks_s)
            if state.closing.is_set():
                return 0
        for stop in stops:
            if stop in text:
                return text.index(stop)
        pieces.put(("text", text[sent:]))
        sent = len(text)
        return None

    def work() -> None:
        try:
            with state.generate_lock:
                generation = state.runner.generate(
                    body["prompt"],
                    max_new_tokens=int(body.get("max_tokens", 16)),
                    stop=on_step,
                    cancel=cancel,
                    temperature=float(body.get("temperature", 0.0)),
                )
            pieces.put(("end", generation.stop_reason))
        finally:
            pieces.put(None)

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    chunks = 0
    try:
        while True:
            item = await asyncio.to_thread(pieces.get)
            if item is None:
                break
            kind, text = item
            if kind == "end":
                yield _event("", None, "length" if text == "length" else "stop")
                yield "data: [DONE]\n\n"
                break
            if not text:
                continue
            if (
                state.faults.die_after_chunks is not None
                and chunks >= state.faults.die_after_chunks
            ):
                raise ServerDied("dying mid-stream on purpose")
            yield _event(text, -0.5, None)
            chunks += 1
    finally:
        if thread.is_alive():
            # The client went away (or we died): stop the model like a real server does.
            cancel.cancel("client disconnected")
            client_gone.set()
            state.cancelled.set()


def _free_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@contextmanager
def serve_completions(runner: ModelRunner) -> Iterator[tuple[str, ServerState]]:
    """Run the server on a free loopback port; yields (base URL ending in /v1, state)."""
    state = ServerState(runner)
    sock = _free_socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(create_app(state), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError("the completion test server failed to start")
            threading.Event().wait(0.01)
        yield f"http://127.0.0.1:{port}/v1", state
    finally:
        state.closing.set()
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def main(argv: list[str] | None = None) -> int:
    """Serve a scripted model until stdin closes; the first stdout line is the base URL."""
    import argparse
    import sys
    from pathlib import Path

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--script", type=Path, required=True, help="JSON: rules, default, …")
    args = parser.parse_args(argv)
    script = json.loads(args.script.read_text(encoding="utf-8"))
    model = ScriptedModel(
        rules=dict(script.get("rules", {})),
        default=str(script.get("default", "")),
        token_delay_s=float(script.get("token_delay_s", 0.0)),
    )
    with serve_completions(model) as (url, _):
        print(url, flush=True)
        sys.stdin.read()  # until the parent closes our stdin (or dies)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
