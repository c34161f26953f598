"""A runner for any OpenAI-compatible `/v1/completions` server (llama.cpp, vLLM, Ollama, TGI).

The FIM prompt is sent as a plain completion prompt with `stream: true`, so the stop rule and
cancellation act on the text as it arrives: when either ends the suggestion, the stream is closed
and the server stops generating for us. A watcher thread enforces the overall time limit and
cancellation even while the server is silent, by closing the response under the reading thread.

On a server that loads LoRA adapters by name (vLLM's `--lora-modules` or its dynamic loading), an
`adapter` name is sent as `model` in place of the base model's. A server that answers 404 for it
(not loaded there) gets the request again for the base model, and the log says so once, until
the adapter serves again.

A `user` (the installation's id, as its telemetry events carry it) goes with every request, as the
OpenAI API's `user` field: the backend's completion endpoint puts the installation on its tenant's
adapter canary arm by it (`backend/routes/completions.py`); other servers ignore it. The backend
names the version that answered in a header, which `Generation.model_version` reports, so the
installation's events say which adapter wrote each suggestion.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import httpx

from completion.fim import UnknownFamily, detect_family, template_for
from completion.runners.errors import RunnerError, RunnerTimeout, RunnerUnavailable
from completion.types import CancelToken, Generation, StopRule

log = logging.getLogger(__name__)

APPROX_BYTES_PER_TOKEN = 3.0
"""Without the server's tokenizer, token counts are estimated from UTF-8 length. BPE tokenizers of
code models average 3-4 bytes per token on source code; dividing by 3 overestimates, so prompts
built to a token budget stay inside the model's context."""
MODEL_VERSION_HEADER = "X-Tabloop-Model-Version"
"""The backend's answer names the model version that wrote it (`base` or the tenant adapter's):
the runner reports it in `Generation.model_version`, and the decision events carry it."""
MAX_STOP_SEQUENCES = 4  # the OpenAI API accepts at most four
_WATCH_INTERVAL_S = 0.02
_ERROR_BODY_CHARS = 500


class HttpRunner:
    """Completions from an OpenAI-compatible server, streamed."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str = "",
        api_key: str = "",
        timeout_s: float = 10.0,
        family: str | None = None,
        logprobs: bool = True,
        adapter: str = "",
        user: str = "",
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.adapter = adapter
        self.user = user
        self._adapter_missing = False
        self.timeout_s = timeout_s
        self.logprobs = logprobs
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=self.base_url, headers=headers, transport=transport)
        weights = f"{model or 'default'}+{adapter}" if adapter else model or "default"
        self.model_id = f"{weights}@{urlsplit(self.base_url).netloc or self.base_url}"
        self.family = family or _family_from_name(model)
        self._stop_sequences = list(template_for(self.family).stop_tokens[:MAX_STOP_SEQUENCES])

    def count_tokens(self, text: str) -> int:
        """Estimated tokens in `text` (see `APPROX_BYTES_PER_TOKEN`): the tokenizer is remote."""
        return math.ceil(len(text.encode("utf-8")) / APPROX_BYTES_PER_TOKEN)

    def generate(
        self,
        prompt: str,
        *,
        max_new_tokens: int,
        stop: StopRule,
        cancel: CancelToken,
        temperature: float = 0.0,
    ) -> Generation:
        """Stream a continuation of `prompt`; raises `RunnerError` subclasses on failure."""
        result = Generation(text="", prompt_tokens=self.count_tokens(prompt))
        if cancel.cancelled:
            result.stop_reason = "cancelled"
            return result
        payload: dict[str, Any] = {
            "prompt": prompt,
            "max_tokens": max_new_tokens,
            "temperature": temperature,
            "stream": True,
            "stop": self._stop_sequences,
        }
        if self.logprobs:
            payload["logprobs"] = 1
        if self.user:
            payload["user"] = self.user
        started = time.perf_counter()
        models = [self.adapter, self.model] if self.adapter and self.adapter != self.model else []
        for model in models or [self.model]:
            if model:
                payload["model"] = model
            else:
                payload.pop("model", None)
            if self._attempt(payload, result, stop, cancel, started, base=model == self.model):
                break
        return result

    def _attempt(
        self,
        payload: dict[str, Any],
        result: Generation,
        stop: StopRule,
        cancel: CancelToken,
        started: float,
        *,
        base: bool,
    ) -> bool:
        """One request into `result`; False when the server does not know the adapter it names
        (then the base model is asked)."""
        watch = _Watch(cancel, started + self.timeout_s)
        left = max(started + self.timeout_s - time.perf_counter(), 0.001)
        try:
            with self._client.stream(
                "POST", "/completions", json=payload, timeout=left
            ) as response:
                watch.start(response)
                if response.status_code == 404 and not base:
                    self._missing_adapter(response)
                    return False
                if response.status_code != 200:
                    raise RunnerError(self._http_error(response))
                result.model_version = response.headers.get(MODEL_VERSION_HEADER, "")
                if not base and self._adapter_missing:
                    self._adapter_missing = False
                    log.info("adapter %s serves again at %s", self.adapter, self.base_url)
                self._consume(response, result, stop, cancel, watch, started)
        except RunnerError:
            raise
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise RunnerUnavailable(
                f"the completion server at {self.base_url} is not reachable ({exc}); "
                "start it or check completion.httpUrl"
            ) from exc
        except (httpx.HTTPError, OSError, RuntimeError) as exc:
            if cancel.cancelled:
                result.stop_reason = "cancelled"
            elif watch.expired or isinstance(exc, httpx.TimeoutException):
                raise self._timeout(result) from exc
            else:
                raise RunnerError(
                    f"the completion server at {self.base_url} broke off the response after "
                    f"{len(result.text)} characters ({type(exc).__name__}: {exc})"
                ) from exc
        finally:
            watch.stop()
        return True

    def _missing_adapter(self, response: httpx.Response) -> None:
        if not self._adapter_missing:
            body = response.read().decode("utf-8", "replace")[:_ERROR_BODY_CHARS]
            log.warning(
                "the completion server at %s does not know adapter %s (HTTP 404: %s); the base "
                "model serves until it does (completion.httpAdapter)",
                self.base_url,
                self.adapter,
                body,
            )
        self._adapter_missing = True

    def _timeout(self, result: Generation) -> RunnerTimeout:
        return RunnerTimeout(
            f"the completion server at {self.base_url} did not finish within "
            f"{self.timeout_s:g}s (completion.httpTimeoutS); got {len(result.text)} characters"
        )

    def _http_error(self, response: httpx.Response) -> str:
        body = response.read().decode("utf-8", "replace")[:_ERROR_BODY_CHARS]
        return (
            f"the completion server at {self.base_url} answered HTTP {response.status_code}: {body}"
        )

    def _consume(
        self,
        response: httpx.Response,
        result: Generation,
        stop: StopRule,
        cancel: CancelToken,
        watch: _Watch,
        started: float,
    ) -> None:
        """Read SSE events into `result` until the server finishes or we stop it."""
        finish: str | None = None
        first_chunk_at: float | None = None
        for line in response.iter_lines():
            if cancel.cancelled:
                result.stop_reason = "cancelled"
                return
            if watch.expired:
                raise self._timeout(result)
            if not line.startswith("data:"):
                continue  # blank separators, `:` keep-alive comments, `event:` lines
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                finish = finish or "stop"
                break
            chunk = _parse_chunk(data, self.base_url)
            if first_chunk_at is None:
                first_chunk_at = time.perf_counter()
                result.prefill_ms = (first_chunk_at - started) * 1000
            choice = chunk["choices"][0] if chunk.get("choices") else {}
            text = choice.get("text") or ""
            logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
            result.token_logprobs.extend(float(lp) for lp in logprobs if lp is not None)
            result.new_tokens += len(logprobs) or (1 if text else 0)
            if usage := chunk.get("usage"):
                result.prompt_tokens = int(usage.get("prompt_tokens", result.prompt_tokens))
            result.text += text
            cut = stop(result.text)
            if cut is not None:
                result.text = result.text[:cut]
                result.stop_reason = "stop"
                result.decode_ms = (time.perf_counter() - first_chunk_at) * 1000
                return  # leaving the `with` closes the stream: the server stops generating
            finish = choice.get("finish_reason") or finish
        else:
            if finish is None:
                raise RunnerError(
                    f"the completion server at {self.base_url} ended the stream without "
                    f"finishing the completion (after {len(result.text)} characters)"
                )
        result.stop_reason = "length" if finish == "length" else "eos"
        if first_chunk_at is not None:
            result.decode_ms = (time.perf_counter() - first_chunk_at) * 1000

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()


def _parse_chunk(data: str, base_url: str) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError as exc:
        raise RunnerError(
            f"the completion server at {base_url} sent invalid JSON: {data[:200]}"
        ) from exc
    if not isinstance(chunk, dict):
        raise RunnerError(
            f"the completion server at {base_url} sent an unexpected event: {data[:200]}"
        )
    if "error" in chunk:
        raise RunnerError(
            f"the completion server at {base_url} reported an error: {chunk['error']}"
        )
    return chunk


def _family_from_name(model: str) -> str:
    try:
        return detect_family((), model)
    except UnknownFamily:
        # tabloop's own backend serves the bundled Qwen model under any name.
        log.warning(
            "cannot tell the FIM format of HTTP model %r; using qwen (set completion.fimTemplate)",
            model,
        )
        return "qwen"


def _interrupt(response: httpx.Response) -> None:
    """End a blocking read on `response` from another thread.

    `Response.close` waits for the reading thread's connection lock, so it cannot interrupt a read
    from a silent server; shutting the socket down makes that read return at once.
    """
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is None:
        response.close()
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _Watch:
    """Interrupts a streaming response when the request is cancelled or its time is up."""

    def __init__(self, cancel: CancelToken, deadline: float) -> None:
        self._cancel = cancel
        self._deadline = deadline
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.expired = False

    def start(self, response: httpx.Response) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(response,), name="tabloop-http-watch", daemon=True
        )
        self._thread.start()

    def _run(self, response: httpx.Response) -> None:
        while not self._done.wait(_WATCH_INTERVAL_S):
            if time.perf_counter() >= self._deadline:
                self.expired = True
            if self.expired or self._cancel.cancelled:
                _interrupt(response)
                return

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
