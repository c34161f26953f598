"""`GET /v1/model`: the tenant's serving adapter version; `GET /v1/model/files/{name}`: its files.

The adapter versions of a tenant are kept in its registry under the backend's cache directory
(`training.registry.scope_dir(cache, tenant=T)`, written by `tabloop train model --tenant` and
the scheduled adapter training). The answer names the serving version, the base model it fits,
the SHA-256 of each file and a checksum of the whole (the manifest's SHA-256, also the entity
tag); clients poll with `If-None-Match`. Before answering, every file is checked against the
manifest: a damaged version is refused (503), never served. With no adapter serving the answer
says so (`version: null`: the base model serves).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from backend.auth import CurrentPrincipal
from backend.deps import Services
from completion.adapters import CONFIG, MANIFEST, WEIGHTS, AdapterError, verify_adapter
from training.registry import AdapterRegistry, AdapterRegistryError, scope_dir

router = APIRouter()

MODEL_VERSION_HEADER = "X-Tabloop-Model-Version"
SERVED_FILES = (CONFIG, WEIGHTS, MANIFEST)


def _serving(cache_dir: Path, tenant: str) -> tuple[str, Path] | None:
    """(name, directory) of the tenant's serving adapter version, or None."""
    try:
        registry = AdapterRegistry(scope_dir(cache_dir, tenant=tenant))
    except ValueError:  # a tenant name that cannot name an adapter directory has none
        return None
    if not (registry.root / "registry.json").is_file():
        return None
    try:
        version = registry.serving()
        return None if version is None else (registry.get(version).name, registry.path(version))
    except AdapterRegistryError as exc:
        raise HTTPException(503, f"the adapter registry is unreadable: {exc}") from None


def _describe(name: str, directory: Path) -> dict[str, Any]:
    try:
        manifest = verify_adapter(directory)
    except AdapterError as exc:
        raise HTTPException(503, f"the serving adapter is damaged: {exc}") from None
    checksum = hashlib.sha256((directory / MANIFEST).read_bytes()).hexdigest()
    return {
        "version": name,
        "base_model": manifest.get("base_model"),
        "checksum": checksum,
        "files": {file: manifest["files"][file] for file in (CONFIG, WEIGHTS)},
    }


@router.get("/v1/model")
async def get_model(principal: CurrentPrincipal, services: Services, request: Request) -> Response:
    """The caller's tenant's serving adapter: version, base model, checksums (304 when the
    client has it)."""
    serving = _serving(services.cache_dir, principal.tenant)
    if serving is None:
        body: dict[str, Any] = {"version": None, "base_model": None, "checksum": None, "files": {}}
        return Response(
            _json(body), media_type="application/json", headers={"Cache-Control": "no-cache"}
        )
    described = await run_in_threadpool(_describe, *serving)
    etag = f'"{described["checksum"]}"'
    headers = {"ETag": etag, "Cache-Control": "no-cache", MODEL_VERSION_HEADER: serving[0]}
    tags = {
        t.strip().removeprefix("W/") for t in request.headers.get("if-none-match", "").split(",")
    }
    if etag in tags or "*" in tags:
        return Response(status_code=304, headers=headers)
    return Response(_json(described), media_type="application/json", headers=headers)


@router.get("/v1/model/files/{name}")
def get_model_file(principal: CurrentPrincipal, services: Services, name: str) -> FileResponse:
    """One file of the caller's tenant's serving adapter (check it against `GET /v1/model`)."""
    if name not in SERVED_FILES:
        raise HTTPException(404, f"not an adapter file: {name!r}")
    serving = _serving(services.cache_dir, principal.tenant)
    if serving is None:
        raise HTTPException(404, "no adapter serves for this tenant: the base model does")
    path = serving[1] / name
    if not path.is_file():
        raise HTTPException(503, f"the serving adapter is damaged: {name} is missing")
    return FileResponse(path, headers={MODEL_VERSION_HEADER: serving[0]})


def _json(body: dict[str, Any]) -> bytes:
    import json

    return json.dumps(body, sort_keys=True).encode()
