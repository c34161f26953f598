"""The wire schema of the index sync: one set of models, imported by the client and the server.

The client (`indexer.sync_client`) builds its requests from these models and validates every
answer with them; the server (`backend.routes.index_sync`) parses requests and shapes answers
with the same ones, so the two cannot drift. Everything here is a keyed identity
(`indexer.sync_keys`): 32-hex keys, 64-hex hashes, keyed paths, line ranges and base64 vectors.

- `POST /v1/index/root` `WorkspaceRef` -> `RootAnswer`
- `POST /v1/index/children` `ChildrenRequest` -> `ChildrenAnswer`
- `POST /v1/index/known` `KeysRequest` -> `KnownAnswer`
- `POST /v1/index/vectors` `KeysRequest` -> `VectorsAnswer`
- `POST /v1/index/apply` `ApplyRequest` -> `RootAnswer` (409 when the claimed root differs)
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

ROOT_PATH = "/v1/index/root"
CHILDREN_PATH = "/v1/index/children"
KNOWN_PATH = "/v1/index/known"
VECTORS_PATH = "/v1/index/vectors"
APPLY_PATH = "/v1/index/apply"

MAX_DEPTH = 60
Key = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
Hash = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
NodePath = Annotated[
    str, StringConstraints(pattern=rf"^[0-9a-f]{{32}}(/[0-9a-f]{{32}}){{0,{MAX_DEPTH - 1}}}$")
]
DirPath = Annotated[
    str, StringConstraints(pattern=rf"^([0-9a-f]{{32}}(/[0-9a-f]{{32}}){{0,{MAX_DEPTH - 1}}})?$")
]
Line = Annotated[int, Field(ge=0, le=10_000_000)]
VectorDtype = Literal["float16", "float32"]
DTYPES = {"float16": np.float16, "float32": np.float32}


class _Request(BaseModel):
    """Requests are strict: an unknown field is refused (422), not silently dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class _Answer(BaseModel):
    """Answers tolerate fields a newer server adds, so an older client keeps working."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class WorkspaceRef(_Request):
    workspace: Key
    model: Key


class ChildrenRequest(WorkspaceRef):
    dirs: list[DirPath]


class KeysRequest(_Request):
    model: Key
    keys: list[Key]


class Upsert(_Request):
    """A file placed at a keyed path: its keyed leaf hash and its chunks' `(key, start, end)`."""

    path: NodePath
    leaf: Hash
    chunks: list[tuple[Key, Line, Line]] = Field(default_factory=list)


class VectorUpload(_Request):
    dtype: VectorDtype
    dimension: int = Field(ge=1)
    items: dict[Key, str] = Field(default_factory=dict)  # chunk key -> base64 vector


class ApplyRequest(WorkspaceRef):
    upserts: list[Upsert] = Field(default_factory=list)
    removes: list[NodePath] = Field(default_factory=list)
    vectors: VectorUpload | None = None
    root: Hash | None = None  # the client's keyed root, claimed on the last apply of a sync


class RootAnswer(_Answer):
    root: Hash


class ChildrenAnswer(_Answer):
    """`{dir: [[name, hash, is_dir], ...]}` for each asked directory."""

    children: dict[DirPath, list[tuple[Key, Hash, bool]]]


class KnownAnswer(_Answer):
    known: list[Key]


class VectorsAnswer(_Answer):
    """`{chunk key: [dtype, dimension, base64]}`; dtypes may mix within one answer."""

    vectors: dict[Key, tuple[VectorDtype, int, str]]
