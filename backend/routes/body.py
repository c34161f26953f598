"""Reading request bodies: one way for every route that takes one.

`read_body` reads the raw body against a size cap (gzip inflated incrementally, so a bomb is
refused with 413 after at most the cap in memory) and answers 408 when the client stops sending
before its `Content-Length` is reached (a client that disconnects mid-body is counted, as
`disconnected`, not logged as an error). `read_json_body` adds the depth bound
(`backend.services.bodies`), checked on the raw bytes before any parser recurses into them, and
`read_json` decodes. Inflating, scanning and decoding are CPU work on bodies of up to the cap
(megabytes): beyond a small size they run in the thread pool, so other requests keep being
served meanwhile. `json_body_openapi` documents such a body in the OpenAPI schema, since these
routes read the request themselves instead of declaring a body parameter.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from fastapi import HTTPException, Request
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from backend.deps import services_of
from backend.services.bodies import exceeds_depth

P = ParamSpec("P")
T = TypeVar("T")

INLINE_BYTES = 64 * 1024
"""Bodies up to this size are scanned and decoded on the event loop: a thread hop would cost
more than the work."""


async def _off_loop(size: int, func: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`func(*args, **kwargs)`, in the thread pool when it works on more than `INLINE_BYTES`."""
    if size <= INLINE_BYTES:
        return func(*args, **kwargs)
    return await run_in_threadpool(func, *args, **kwargs)


def _refuse(
    request: Request, code: int, reason: str, detail: str, headers: dict[str, str] | None = None
) -> HTTPException:
    # Routes without a metrics parameter read bodies too: the counters come from the services.
    metrics = services_of(request).metrics
    metrics.inc("tabloop_events_rejected_total", reason=reason)
    metrics.inc("tabloop_ingest_requests_total", status=str(code))
    return HTTPException(code, detail=detail, headers=headers)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, decompressed when gzipped, refused with 413 beyond `limit` bytes and
    with 408 when the client pauses longer than the read timeout (a short body)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _refuse(request, 413, "body_too_large", f"body over {limit} bytes")
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", "gzip"):
        raise _refuse(request, 415, "encoding", f"unsupported Content-Encoding {encoding!r}")
    timeout = services_of(request).bodies.read_timeout_s
    inflater = zlib.decompressobj(wbits=31) if encoding == "gzip" else None
    out = bytearray()
    received = 0
    stream = request.stream()
    while True:
        try:
            # The server waits for a body as long as it takes; a stalled one must not hold a
            # connection and a worker's memory forever.
            async with asyncio.timeout(timeout):
                chunk = await anext(stream, None)
        except ClientDisconnect:
            # Nobody will read the answer: counted, and no traceback in the log.
            raise _refuse(request, 400, "disconnected", "client disconnected mid-body") from None
        except TimeoutError:
            raise _refuse(
                request,
                408,
                "timeout",
                f"body incomplete: nothing received for {timeout:g} s",
                # The rest of the body may still come: the connection cannot carry another request.
                headers={"Connection": "close"},
            ) from None
        if chunk is None:
            break
        received += len(chunk)
        if received > limit:
            raise _refuse(request, 413, "body_too_large", f"body over {limit} bytes")
        if inflater is None:
            out += chunk
            continue
        try:
            # Never more output than the cap allows: a bomb stops here, not in memory. Always in
            # the pool: a small compressed chunk can inflate to megabytes.
            out += await run_in_threadpool(inflater.decompress, chunk, limit + 1 - len(out))
        except zlib.error as exc:
            raise _refuse(request, 400, "malformed", f"bad gzip data: {exc}") from exc
        if len(out) > limit or inflater.unconsumed_tail:
            raise _refuse(request, 413, "body_too_large", f"body over {limit} bytes inflated")
    if inflater is not None and (not inflater.eof or inflater.unused_data):
        raise _refuse(request, 400, "malformed", "truncated or trailing gzip data")
    return bytes(out)


async def read_json_body(request: Request, limit: int) -> bytes:
    """`read_body`, refused with 400 when arrays and objects nest deeper than the app allows."""
    body = await read_body(request, limit)
    max_depth = services_of(request).bodies.max_depth
    if await _off_loop(len(body), exceeds_depth, body, max_depth):
        raise _refuse(request, 400, "too_deep", f"JSON nested deeper than {max_depth} levels")
    return body


async def read_json(request: Request, limit: int) -> Any:
    """The decoded JSON body (bounded as `read_json_body`), or 400 when it is not JSON."""
    body = await read_json_body(request, limit)
    try:
        return await _off_loop(len(body), json.loads, body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError and integers past Python's digit limit.
        raise HTTPException(400, detail=f"body is not JSON: {exc}") from exc


def json_body_openapi(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` documenting a required JSON body of `model` (definitions inlined)."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def inline(node: Any, seen: frozenset[str]) -> Any:
        if isinstance(node, list):
            return [inline(item, seen) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            name = ref.removeprefix("#/$defs/")
            # A recursive model would inline forever: its inner occurrences accept anything.
            return {} if name in seen else inline(definitions[name], seen | {name})
        # Discriminator mappings name the definitions that are inlined away.
        return {key: inline(value, seen) for key, value in node.items() if key != "discriminator"}

    body = {"content": {"application/json": {"schema": inline(schema, frozenset())}}}
    return {"requestBody": {**body, "required": True}}
