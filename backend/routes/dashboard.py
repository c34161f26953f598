"""`/dashboard`: the page, and its assets, built by `make dashboard` into the package.

The page itself holds no data: it asks for a token once (kept in the browser's session
storage) and reads everything from `/v1/stats/...` with it, so the dashboard is behind the same
bearer tokens as the API. Every page name answers the same HTML (`no-cache`: a new build is seen
at once); its script and styles have content hashes in their names and are cached for a year.
"""

from __future__ import annotations

import mimetypes
from functools import lru_cache
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request, Response, status
from fastapi.responses import RedirectResponse

from backend.dashboard import ASSETS, INDEX, STATIC_DIR

router = APIRouter(include_in_schema=False)

PAGES = ("overview", "policies", "ingestion", "breakdown")
IMMUTABLE = "public, max-age=31536000, immutable"
NOT_BUILT = "the dashboard's assets are not built: run `make dashboard` (npm) in the checkout"


@lru_cache(maxsize=64)
def _read(path: Path) -> bytes:
    return path.read_bytes()


def _index() -> bytes:
    path = STATIC_DIR / INDEX
    if not path.is_file():
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, detail=NOT_BUILT)
    return path.read_bytes()  # small, and re-read so a rebuild is served without a restart


@router.get("/dashboard")
def dashboard_root() -> RedirectResponse:
    return RedirectResponse("/dashboard/overview", status_code=307)


@router.get("/dashboard/assets/{name}")
def asset(name: str, request: Request) -> Response:
    """A built asset; its name carries its content hash, so it never changes."""
    folder = STATIC_DIR / ASSETS
    path = folder / name
    if "/" in name or name.startswith(".") or not path.is_file():
        raise HTTPException(status.HTTP_404_NOT_FOUND)
    etag = '"' + name + '"'
    headers = {"Cache-Control": IMMUTABLE, "ETag": etag, "X-Content-Type-Options": "nosniff"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    media = mimetypes.guess_type(name)[0] or "application/octet-stream"
    if media.startswith("text/") or media == "application/javascript":
        media += "; charset=utf-8"
    return Response(_read(path), media_type=media, headers=headers)


@router.get("/dashboard/{page}")
def page(page: str) -> Response:
    """The dashboard's page (one HTML for every page name; the script draws the page)."""
    if page not in PAGES:
        raise HTTPException(status.HTTP_404_NOT_FOUND)
    return Response(
        _index(),
        media_type="text/html; charset=utf-8",
        headers={
            "Cache-Control": "no-cache",
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'self'; style-src 'self'; "
            "img-src 'self' data:; frame-ancestors 'none'",
        },
    )
