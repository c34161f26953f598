"""The HTTP side of the index sync: one call per protocol message, bounded retries, byte counts.

Request bodies are JSON, gzipped; they hold keyed identities only (`indexer.sync_keys`). Retries
follow the telemetry sender's rules: 429, 502, 503, 504 and connection errors are retried with
jittered exponential backoff under one deadline, honouring `Retry-After`; other 4xx are final.
"""

from __future__ import annotations

import base64
import gzip
import json
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np

RETRYABLE = frozenset({429, 502, 503, 504})
DTYPES = {"float16": np.float16, "float32": np.float32}


class SyncFailed(RuntimeError):
    """The server could not be reached or kept failing; try again later."""


class SyncRejected(RuntimeError):
    """The server refused a message (4xx other than 429): retrying the same will not help."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


@dataclass
class WireStats:
    """What crossed the wire: requests and body bytes each way (after compression)."""

    requests: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0

    @property
    def total_bytes(self) -> int:
        return self.bytes_sent + self.bytes_received


class SyncClient:
    """Talks to `/v1/index/*` of a tabloop backend with a tenant's bearer token."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout_s: float = 30.0,
        retry_deadline_s: float = 30.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s, transport=transport
        )
        self.retry_deadline_s = retry_deadline_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.stats = WireStats()
        self._stop = threading.Event()

    def close(self) -> None:
        """Interrupt any backoff and close the connections."""
        self._stop.set()
        self._http.close()

    def post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST `payload` gzipped; the decoded JSON answer. Raises SyncFailed / SyncRejected."""
        body = gzip.compress(json.dumps(payload, separators=(",", ":")).encode(), mtime=0)
        deadline = time.monotonic() + self.retry_deadline_s
        delay = self.backoff_initial_s
        while True:
            wait: float | None = None
            try:
                response = self._http.post(path, content=body, headers={"Content-Encoding": "gzip"})
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                self.stats.requests += 1
                self.stats.bytes_sent += len(body)
                self.stats.bytes_received += len(response.content)
                if response.status_code == 200:
                    answer: dict[str, Any] = response.json()
                    return answer
                detail = _detail(response)
                if response.status_code not in RETRYABLE:
                    raise SyncRejected(response.status_code, detail)
                problem = f"HTTP {response.status_code}: {detail}"
                wait = _retry_after(response)
            pause = wait if wait is not None else delay * random.uniform(0.5, 1.0)
            if time.monotonic() + pause > deadline or self._stop.is_set():
                raise SyncFailed(f"{path}: {problem}")
            self._stop.wait(pause)
            delay = min(delay * 2, self.backoff_max_s)

    # -- protocol messages -------------------------------------------------------------------

    def root(self, workspace: str, model: str) -> str:
        return str(self.post("/v1/index/root", {"workspace": workspace, "model": model})["root"])

    def children(
        self, workspace: str, model: str, dirs: Sequence[str]
    ) -> dict[str, list[tuple[str, str, bool]]]:
        answer = self.post(
            "/v1/index/children", {"workspace": workspace, "model": model, "dirs": list(dirs)}
        )
        return {
            d: [(str(n), str(h), bool(is_dir)) for n, h, is_dir in kids]
            for d, kids in answer["children"].items()
        }

    def known(self, model: str, keys: Sequence[str]) -> set[str]:
        answer = self.post("/v1/index/known", {"model": model, "keys": list(keys)})
        return set(answer["known"])

    def vectors(self, model: str, keys: Sequence[str]) -> dict[str, np.ndarray]:
        """Float32 vectors of the keys the server holds."""
        answer = self.post("/v1/index/vectors", {"model": model, "keys": list(keys)})
        out: dict[str, np.ndarray] = {}
        for key, (dtype, dimension, encoded) in answer["vectors"].items():
            vector = np.frombuffer(base64.b64decode(encoded), dtype=DTYPES[dtype])
            if vector.shape == (int(dimension),):
                out[key] = vector.astype(np.float32)
        return out

    def apply(self, payload: dict[str, Any]) -> str:
        return str(self.post("/v1/index/apply", payload)["root"])


def encode_vectors(vectors: dict[str, np.ndarray], dtype: str) -> dict[str, Any]:
    """The `vectors` field of an apply message."""
    kind = DTYPES[dtype]
    dimension = len(next(iter(vectors.values()))) if vectors else 1
    return {
        "dtype": dtype,
        "dimension": dimension,
        "items": {
            key: base64.b64encode(np.asarray(v, dtype=kind).tobytes()).decode()
            for key, v in vectors.items()
        },
    }


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail", ""))[:500]
    except (ValueError, AttributeError):
        return response.text[:500]


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
