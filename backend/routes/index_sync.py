"""`/v1/index/*`: the server side of the index sync.

The client (`indexer.sync`) sends only keyed identities (see `indexer.sync_keys`): keyed paths,
keyed leaf and chunk hashes, line ranges and vectors. Every body is read against a size cap
(optionally gzipped) and a depth bound, validated field by field (hex of the right length,
bounded lists, sane line ranges, finite vectors of one dimension) and refused with a 4xx that
says what is wrong.

- `POST /v1/index/root` `{workspace, model}` -> `{root}`
- `POST /v1/index/children` `{workspace, model, dirs: [...]}` -> `{children: {dir: [[name,
  hash, is_dir], ...]}}`
- `POST /v1/index/known` `{model, keys}` -> `{known}`: which chunk vectors the tenant holds
- `POST /v1/index/vectors` `{model, keys}` -> `{vectors: {key: [dtype, dimension, base64]}}`
- `POST /v1/index/apply` `{workspace, model, upserts, removes, vectors, root?}` -> `{root}`;
  409 when the recomputed root is not the claimed `root` (nothing is kept).

The request and answer models are `indexer.sync_protocol`'s, the schema the client sends and
reads with; this module adds only what a server must (size caps and consistency checks).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool

from backend.auth import CurrentPrincipal
from backend.deps import services_of
from backend.routes.body import json_body_openapi, read_json
from backend.sync.store import (
    FileUpsert,
    IndexSyncStore,
    MissingVectors,
    RootMismatch,
    SyncError,
    VectorBlob,
    ancestors,
)
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

router = APIRouter()
T = TypeVar("T", bound=BaseModel)


@dataclass(frozen=True)
class SyncLimits:
    """Bounds on one sync request."""

    max_body_bytes: int = 16 * 1024 * 1024
    max_dirs: int = 2048
    max_keys: int = 8192
    max_files: int = 4096
    max_chunks: int = 65536
    max_chunks_per_file: int = 8192
    max_removes: int = 8192
    max_vectors: int = 4096
    max_dimension: int = 4096


LIMITS = SyncLimits()


def _store(request: Request) -> IndexSyncStore:
    return services_of(request).index_sync


def _limits(request: Request) -> SyncLimits:
    return LIMITS


async def _parse(request: Request, model: type[T]) -> T:
    payload = await read_json(request, _limits(request).max_body_bytes)
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise HTTPException(422, detail=validation_detail(exc)) from exc


def validation_detail(exc: ValidationError) -> str:
    """The first validation error as `field.path: message`, for a 4xx answer."""
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])


def _bound(what: str, count: int, limit: int) -> None:
    if count > limit:
        raise HTTPException(413, detail=f"at most {limit} {what} a request, got {count}")


@router.post(ROOT_PATH, openapi_extra=json_body_openapi(WorkspaceRef))
async def root(request: Request, principal: CurrentPrincipal) -> RootAnswer:
    """The root hash the server holds for a keyed workspace."""
    ref = await _parse(request, WorkspaceRef)
    found = await run_in_threadpool(
        _store(request).root, principal.tenant_id, ref.workspace, ref.model
    )
    return RootAnswer(root=found)


@router.post(CHILDREN_PATH, openapi_extra=json_body_openapi(ChildrenRequest))
async def children(request: Request, principal: CurrentPrincipal) -> ChildrenAnswer:
    """Names and hashes of the children of a batch of directories (one tree level)."""
    ask = await _parse(request, ChildrenRequest)
    _bound("directories", len(ask.dirs), _limits(request).max_dirs)
    found = await run_in_threadpool(
        _store(request).children, principal.tenant_id, ask.workspace, ask.model, ask.dirs
    )
    return ChildrenAnswer(children=found)


@router.post(KNOWN_PATH, openapi_extra=json_body_openapi(KeysRequest))
async def known(request: Request, principal: CurrentPrincipal) -> KnownAnswer:
    """Which of the given chunk keys have a vector in the tenant's store."""
    ask = await _parse(request, KeysRequest)
    _bound("keys", len(ask.keys), _limits(request).max_keys)
    found = await run_in_threadpool(_store(request).known, principal.tenant_id, ask.model, ask.keys)
    return KnownAnswer(known=found)


@router.post(VECTORS_PATH, openapi_extra=json_body_openapi(KeysRequest))
async def vectors(request: Request, principal: CurrentPrincipal) -> VectorsAnswer:
    """The tenant's vectors of the given chunk keys (a caller proves a key by knowing it)."""
    ask = await _parse(request, KeysRequest)
    _bound("keys", len(ask.keys), _limits(request).max_vectors)
    blobs = await run_in_threadpool(
        _store(request).vectors, principal.tenant_id, ask.model, ask.keys
    )
    # One dimension per model is enforced on upload; dtypes may mix (float16 and float32).
    return VectorsAnswer(
        vectors={b.chunk: (b.dtype, b.dimension, base64.b64encode(b.data).decode()) for b in blobs}
    )


def _decode_vectors(upload: VectorUpload, limits: SyncLimits) -> list[VectorBlob]:
    _bound("vectors", len(upload.items), limits.max_vectors)
    if upload.dimension > limits.max_dimension:
        raise HTTPException(422, detail=f"dimension over {limits.max_dimension}")
    dtype = DTYPES[upload.dtype]
    size = upload.dimension * np.dtype(dtype).itemsize
    out: list[VectorBlob] = []
    for key, encoded in upload.items.items():
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise HTTPException(422, detail=f"vector {key}: not base64") from exc
        if len(data) != size:
            raise HTTPException(
                422, detail=f"vector {key}: {len(data)} bytes, expected {size} for the dimension"
            )
        if not np.isfinite(np.frombuffer(data, dtype=dtype)).all():
            raise HTTPException(422, detail=f"vector {key}: not finite")
        out.append(VectorBlob(key, upload.dtype, upload.dimension, data))
    return out


def _check_consistent(ask: ApplyRequest, limits: SyncLimits) -> None:
    _bound("files", len(ask.upserts), limits.max_files)
    _bound("removals", len(ask.removes), limits.max_removes)
    chunks = 0
    for item in ask.upserts:
        _bound("chunks per file", len(item.chunks), limits.max_chunks_per_file)
        chunks += len(item.chunks)
        for key, start, end in item.chunks:
            if end <= start:
                raise HTTPException(422, detail=f"chunk {key}: empty line range {start}-{end}")
    _bound("chunks", chunks, limits.max_chunks)
    paths = [u.path for u in ask.upserts]
    placed = set(paths)
    if len(placed) != len(paths):
        raise HTTPException(422, detail="a file is placed twice")
    if placed & set(ask.removes):
        raise HTTPException(422, detail="a path is both placed and removed")
    for path in paths:
        if any(a in placed for a in ancestors(path)):
            raise HTTPException(422, detail=f"{path} is placed under another placed file")


@router.post(APPLY_PATH, openapi_extra=json_body_openapi(ApplyRequest))
async def apply(request: Request, principal: CurrentPrincipal) -> RootAnswer:
    """Store vectors, place and remove files; the server re-hashes and checks the root."""
    limits = _limits(request)
    ask = await _parse(request, ApplyRequest)
    _check_consistent(ask, limits)
    blobs = _decode_vectors(ask.vectors, limits) if ask.vectors is not None else []
    upserts = [FileUpsert(u.path, u.leaf, u.chunks) for u in ask.upserts]
    try:
        new_root = await run_in_threadpool(
            lambda: _store(request).apply(
                principal.tenant_id,
                ask.workspace,
                ask.model,
                upserts=upserts,
                removes=ask.removes,
                vectors=blobs,
                expect_root=ask.root,
            )
        )
    except RootMismatch as exc:
        raise HTTPException(409, detail=str(exc)) from exc
    except MissingVectors as exc:
        raise HTTPException(422, detail=str(exc)) from exc
    except SyncError as exc:
        raise HTTPException(422, detail=str(exc)) from exc
    return RootAnswer(root=new_root)
