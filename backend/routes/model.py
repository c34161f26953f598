"""`GET /v1/model`: the tenant's serving adapter version; `GET /v1/model/files/{name}`: its files.

The adapter versions of a tenant are kept in its registry in the database, their files in the
blob store (`backend.adapters.registry`, written by `tabloop train model --tenant` and the
scheduled adapter training); each instance serves them from its own checked copy. The answer
names the serving version, the base model it fits, the SHA-256 of each file and a checksum of
the whole (the manifest's SHA-256, also the entity tag); clients poll with `If-None-Match`.
Before either route answers, every file is checked against the manifest and the database's
checksums (`backend.services.served_adapters`: once per change of the files, not per poll): a
damaged version, blob or registry is refused (503, naming no server path), never served. With
no adapter serving the answer says so (`version: null`: the base model serves).

While a canary runs (`backend.adapters.canary`), the version answered depends on the asking
installation (`?install_id=`, the id its decision events carry): a stable hash puts each on the
canary's arm or the serving one (`arm` in the body), so a user stays on one arm; without it the
serving version is answered.

Files are answered with `Cache-Control: no-cache` and their SHA-256 as entity tag: their URL
does not name the version, so a cache must ask again each time.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, Request, Response
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from backend.auth import CurrentPrincipal
from backend.deps import Services
from backend.services.served_adapters import (
    SERVING_ARM,
    AdapterUnavailable,
    ServedAdapter,
    ServedAdapters,
)
from completion.adapters import CONFIG, MANIFEST, WEIGHTS
from completion.runners.http import MODEL_VERSION_HEADER

router = APIRouter()

SERVED_FILES = (CONFIG, WEIGHTS, MANIFEST)
InstallId = Annotated[
    str | None,
    Query(
        pattern=r"^[A-Za-z0-9_.:+#/-]{1,128}$",
        description="The asking installation's id (its events' `install_id`): while a canary "
        "runs, it picks the client's arm, the same one on every request.",
    ),
]


async def _serving(
    adapters: ServedAdapters, tenant: str, client: str | None
) -> ServedAdapter | None:
    try:
        return await run_in_threadpool(adapters.serving, tenant, client)
    except AdapterUnavailable as exc:
        raise HTTPException(503, str(exc)) from None


def _matches(request: Request, etag: str) -> bool:
    tags = {
        t.strip().removeprefix("W/") for t in request.headers.get("if-none-match", "").split(",")
    }
    return etag in tags or "*" in tags


@router.get("/v1/model")
async def get_model(
    principal: CurrentPrincipal, services: Services, request: Request, install_id: InstallId = None
) -> Response:
    """The adapter the caller should serve: version, arm, base model, checksums (304 when the
    client has it). While a canary runs, `install_id` puts the client on one arm."""
    served = await _serving(services.served_adapters, principal.tenant, install_id)
    if served is None:
        body: dict[str, Any] = {
            "version": None,
            "arm": SERVING_ARM,
            "base_model": None,
            "checksum": None,
            "files": {},
        }
        return Response(
            _json(body), media_type="application/json", headers={"Cache-Control": "no-cache"}
        )
    etag = f'"{served.checksum}"'
    headers = {"ETag": etag, "Cache-Control": "no-cache", MODEL_VERSION_HEADER: served.name}
    if _matches(request, etag):
        return Response(status_code=304, headers=headers)
    return Response(_json(served.describe()), media_type="application/json", headers=headers)


@router.get("/v1/model/files/{name}")
async def get_model_file(
    principal: CurrentPrincipal,
    services: Services,
    request: Request,
    name: str,
    install_id: InstallId = None,
) -> Response:
    """One file of the adapter the caller should serve (the same `install_id` as for
    `GET /v1/model`), verified against its manifest (check it against `GET /v1/model`;
    `X-Tabloop-Model-Version` names the version it belongs to)."""
    if name not in SERVED_FILES:
        raise HTTPException(404, f"not an adapter file: {name!r}")
    served = await _serving(services.served_adapters, principal.tenant, install_id)
    if served is None:
        raise HTTPException(404, "no adapter serves for this tenant: the base model does")
    digest = served.checksum if name == MANIFEST else str(served.manifest["files"][name])
    etag = f'"{digest}"'
    headers = {"ETag": etag, "Cache-Control": "no-cache", MODEL_VERSION_HEADER: served.name}
    if _matches(request, etag):
        return Response(status_code=304, headers=headers)
    if name == MANIFEST:  # the bytes that were verified, not a second read
        return Response(served.manifest_bytes, media_type="application/json", headers=headers)
    if not served.unchanged(name):  # replaced since it was verified a moment ago
        raise HTTPException(503, f"the serving adapter changed while {name} was asked for")
    return FileResponse(served.directory / name, headers=headers)


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True).encode()
