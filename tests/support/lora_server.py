"""A scripted multi-LoRA server on loopback that speaks vLLM's dynamic LoRA protocol, for tests.

    with LoraServer(base_model="base", api_key="k") as server:
        server.url                 # http://127.0.0.1:PORT/v1, as a client configures it
        server.loaded              # adapter name -> SHA-256 of the weights it read at load time
        server.calls               # (path, JSON body) of every request, in order
        server.refuse_loads = "out of memory"   # answer every load with HTTP 500 and this
        server.restart()           # forget every loaded adapter, as a restarted server does

Routes, as vLLM (`--enable-lora`, `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`) answers them:
`POST /v1/load_lora_adapter {lora_name, lora_path}` reads the adapter's files from `lora_path`
(200; 400 when the name is loaded already or the files are missing), `POST
/v1/unload_lora_adapter {lora_name}` (200; 404 when it is not loaded), `GET /v1/models` (the base
model and each loaded adapter, whose `root` is its path and `parent` the base), and `POST
/v1/completions`, whose `model` must be the base model's name or a loaded adapter's (else 404,
"does not exist"). A completion's text says which weights wrote it: `[<model> <12 hex of the
weights>]` (`base` for the base model), whole or as server-sent events.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from backend.local import ServerThread, bind_loopback
from completion.adapters import CONFIG, WEIGHTS

BASE_WEIGHTS = "base"


def weights_digest(adapter: Path) -> str:
    """How the server names an adapter's weights in its completions: 12 hex of their SHA-256."""
    return hashlib.sha256((adapter / WEIGHTS).read_bytes()).hexdigest()[:12]


def _error(status: int, message: str) -> JSONResponse:
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": status}}, status_code=status
    )


class LoraServer:
    """The scripted server, serving in a thread on a free loopback port."""

    def __init__(self, *, base_model: str = "base-model", api_key: str = "") -> None:
        self.base_model = base_model
        self.api_key = api_key
        self.loaded: dict[str, str] = {}
        self.paths: dict[str, str] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.refuse_loads: str | None = None
        self._lock = threading.Lock()
        self._thread = ServerThread(self._app(), bind_loopback())
        self.url = f"{self._thread.url}/v1"

    def __enter__(self) -> LoraServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.stop()

    def restart(self) -> None:
        """Forget every loaded adapter (dynamically loaded adapters do not survive a restart)."""
        with self._lock:
            self.loaded.clear()
            self.paths.clear()

    def calls_to(self, path: str) -> list[dict[str, Any]]:
        """The JSON bodies sent to `path` (`/v1/completions`, ...), in order."""
        with self._lock:
            return [body for called, body in self.calls if called == path]

    def completion_models(self) -> list[str]:
        """The `model` of every completion request, in order."""
        return [str(body.get("model", "")) for body in self.calls_to("/v1/completions")]

    def _app(self) -> FastAPI:
        app = FastAPI()
        server = self

        @app.middleware("http")
        async def record(request: Request, call_next: Any) -> Response:
            if server.api_key and request.headers.get("authorization") != (
                f"Bearer {server.api_key}"
            ):
                return _error(401, "Unauthorized")
            raw = await request.body()
            body = json.loads(raw) if raw else {}
            with server._lock:
                server.calls.append((request.url.path, body))
            request.state.body = body
            response: Response = await call_next(request)
            return response

        @app.post("/v1/load_lora_adapter")
        async def load(request: Request) -> Response:
            body = request.state.body
            name, path = str(body.get("lora_name", "")), Path(str(body.get("lora_path", "")))
            if server.refuse_loads is not None:
                return _error(500, server.refuse_loads)
            with server._lock:
                if name in server.loaded:
                    return _error(400, f"The lora adapter '{name}' has already been loaded.")
                if not ((path / CONFIG).is_file() and (path / WEIGHTS).is_file()):
                    return _error(400, f"No adapter found at {path}")
                server.loaded[name] = weights_digest(path)
                server.paths[name] = str(path)
            return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

        @app.post("/v1/unload_lora_adapter")
        async def unload(request: Request) -> Response:
            name = str(request.state.body.get("lora_name", ""))
            with server._lock:
                if server.loaded.pop(name, None) is None:
                    return _error(404, f"The lora adapter '{name}' cannot be found.")
                server.paths.pop(name, None)
            return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

        @app.get("/v1/models")
        async def models() -> Response:
            with server._lock:
                cards = [{"id": server.base_model, "object": "model", "root": server.base_model}]
                cards += [
                    {"id": name, "object": "model", "root": path, "parent": server.base_model}
                    for name, path in server.paths.items()
                ]
            return JSONResponse({"object": "list", "data": cards})

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            body = request.state.body
            model = str(body.get("model") or server.base_model)
            with server._lock:
                weights = BASE_WEIGHTS if model == server.base_model else server.loaded.get(model)
            if weights is None:
                return _error(404, f"The model `{model}` does not exist.")
            text = f"[{model} {weights}]"
            head = {"id": "cmpl-scripted", "object": "text_completion", "model": model}
            if not body.get("stream"):
                choice = {"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}
                return JSONResponse({**head, "choices": [choice]})
            return StreamingResponse(_events(head, text), media_type="text/event-stream")

        return app


def _events(head: dict[str, Any], text: str) -> Iterator[str]:
    middle = len(text) // 2
    for piece, finish in ((text[:middle], None), (text[middle:], None), ("", "stop")):
        choice = {"index": 0, "text": piece, "finish_reason": finish}
        yield f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"
    yield "data: [DONE]\n\n"
