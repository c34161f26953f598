"""The HTTP side of the index sync: one call per protocol message, bounded retries, byte counts.

Request bodies are JSON, gzipped; they hold keyed identities only (`indexer.sync_keys`). Every
message and answer is a model of `indexer.sync_protocol`, the schema the server uses too; an
answer that does not fit it is a failure, not a `KeyError` further on. Retries are the shared
rule of `common.http`: 408, 429, 500, 502, 503, 504 and connection errors are retried with
jittered exponential backoff under one deadline, honouring `Retry-After` (seconds or an HTTP
date); any other status is `SyncRejected`. A rejection deletes nothing, here or on the server:
the sync loop records it (a 401 after a token rotation, a 404 from a wrong URL) and tries again
after its backoff.
"""

from __future__ import annotations

import base64
import gzip
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import numpy as np
from pydantic import BaseModel, ValidationError

from common.http import Backoff, Refused, RetryingClient, RetryPolicy, Unavailable
from indexer.sync_protocol import (
    APPLY_PATH,
    CHILDREN_PATH,
    DTYPES,
    KNOWN_PATH,
    ROOT_PATH,
    VECTORS_PATH,
    ApplyRequest,
    ChildrenAnswer,
    ChildrenRequest,
    KeysRequest,
    KnownAnswer,
    RootAnswer,
    VectorsAnswer,
    VectorUpload,
    WorkspaceRef,
)

A = TypeVar("A", bound=BaseModel)


class SyncFailed(RuntimeError):
    """The server could not be reached or kept failing; try again later."""


class SyncRejected(RuntimeError):
    """The server refused a message (a status that is not retried): sending the same again at
    once will not help; `status` tells a bad message (400, 409, 413, 422) from a refused
    client (401, 403, 404)."""

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
    """Talks to `/v1/index/*` of a tabloop backend with a tenant's bearer token.

    `retry_deadline_s` bounds the retries of each message (it may be changed between calls);
    an attempt itself keeps the full `timeout_s`, since a large apply may need it.
    """

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
        self.retry_deadline_s = retry_deadline_s
        # Public for its counters (`http.stats`): the retries and waits of every message.
        self.http = RetryingClient(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            timeout_s=timeout_s,
            policy=RetryPolicy(
                deadline_s=retry_deadline_s,
                backoff=Backoff(backoff_initial_s, backoff_max_s),
                attempts_within_deadline=False,
            ),
            transport=transport,
        )

    @property
    def stats(self) -> WireStats:
        """What crossed the wire so far (answered requests; a snapshot)."""
        sent = self.http.stats
        return WireStats(sent.responses, sent.bytes_sent, sent.bytes_received)

    def close(self) -> None:
        """Interrupt any backoff and close the connections."""
        self.http.close()

    def exchange(self, path: str, message: BaseModel, answer: type[A]) -> A:
        """POST `message` gzipped and read the answer as `answer`.

        Raises SyncRejected (a final refusal) or SyncFailed (unreachable, kept failing, or an
        answer that does not fit the protocol).
        """
        body = gzip.compress(message.model_dump_json(exclude_none=True).encode(), mtime=0)
        deadline = time.monotonic() + self.retry_deadline_s
        try:
            response = self.http.post(
                path, content=body, headers={"Content-Encoding": "gzip"}, deadline=deadline
            )
        except Refused as exc:
            raise SyncRejected(exc.status, exc.detail) from exc
        except Unavailable as exc:
            raise SyncFailed(f"{path}: {exc.problem}") from exc
        try:
            return answer.model_validate_json(response.content)
        except ValidationError as exc:
            raise SyncFailed(f"{path}: unreadable answer: {exc.errors()[:1]}") from exc

    # -- protocol messages -------------------------------------------------------------------

    def root(self, workspace: str, model: str) -> str:
        """The keyed root the server holds for the workspace (the empty root if none)."""
        message = WorkspaceRef(workspace=workspace, model=model)
        return self.exchange(ROOT_PATH, message, RootAnswer).root

    def children(
        self, workspace: str, model: str, dirs: Sequence[str]
    ) -> dict[str, list[tuple[str, str, bool]]]:
        """`{dir: [(name, hash, is_dir), ...]}` of the server's tree, one level of it."""
        message = ChildrenRequest(workspace=workspace, model=model, dirs=list(dirs))
        answer = self.exchange(CHILDREN_PATH, message, ChildrenAnswer)
        return {d: list(kids) for d, kids in answer.children.items()}

    def known(self, model: str, keys: Sequence[str]) -> set[str]:
        """Which of the chunk keys the tenant's store holds a vector of."""
        message = KeysRequest(model=model, keys=list(keys))
        return set(self.exchange(KNOWN_PATH, message, KnownAnswer).known)

    def vectors(self, model: str, keys: Sequence[str]) -> dict[str, np.ndarray]:
        """Float32 vectors of the keys the server holds."""
        message = KeysRequest(model=model, keys=list(keys))
        answer = self.exchange(VECTORS_PATH, message, VectorsAnswer)
        out: dict[str, np.ndarray] = {}
        for key, (dtype, dimension, encoded) in answer.vectors.items():
            vector = np.frombuffer(base64.b64decode(encoded), dtype=DTYPES[dtype])
            if vector.shape == (dimension,):
                out[key] = vector.astype(np.float32)
        return out

    def apply(self, message: ApplyRequest | Mapping[str, Any]) -> str:
        """Send one apply message; the server's new keyed root."""
        if not isinstance(message, ApplyRequest):
            message = ApplyRequest.model_validate(message)
        return self.exchange(APPLY_PATH, message, RootAnswer).root


def encode_vectors(vectors: dict[str, np.ndarray], dtype: str) -> VectorUpload:
    """The `vectors` field of an apply message."""
    kind = DTYPES[dtype]
    dimension = len(next(iter(vectors.values()))) if vectors else 1
    return VectorUpload.model_validate(
        {
            "dtype": dtype,
            "dimension": dimension,
            "items": {
                key: base64.b64encode(np.asarray(v, dtype=kind).tobytes()).decode()
                for key, v in vectors.items()
            },
        }
    )
