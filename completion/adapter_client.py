"""The editor side of adapter serving: fetch the tenant's serving adapter from the backend.

`AdapterFetcher.fetch()` asks `GET /v1/model` with the entity tag of what it holds (an unchanged
version costs a 304) and the installation's id (while a canary runs, the backend answers the
version of this installation's arm, the same one every time), downloads the files of a new version
into a fresh directory of the cache, checks every file against the SHA-256 the backend announced
and the manifest against the announced checksum, and only then renames the directory into place. It
answers the local directory of the version that serves (or None: the tenant's base model serves)
and remembers it on disk, so the next start serves it without a backend. Anything that goes wrong
(no backend, a network error, a file that does not match) raises `AdapterFetchError` and leaves
what was fetched before untouched: the caller keeps serving what it serves.

Whether the adapter fits the loaded model is the runner's check (`completion.adapters`), made
before the model is touched, like for any other adapter.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from completion.adapters import CONFIG, MANIFEST, WEIGHTS, AdapterError, verify_adapter

STATE_FILE = "serving.json"
MAX_FILE_BYTES = 2 << 30  # an adapter of a 7B model at rank 64 is well under this
STALE_DOWNLOAD_S = 3600.0
KEPT_VERSIONS = 2  # the serving version and the one before (a rollback is a rename away)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class AdapterFetchError(RuntimeError):
    """The backend's adapter could not be fetched or did not check out; nothing changed."""


@dataclass(frozen=True)
class Fetched:
    """What the backend serves: `path` is None when the base model serves."""

    version: str | None
    path: Path | None
    checksum: str | None


class AdapterFetcher:
    """Keeps a verified local copy of the tenant's serving adapter; call from one thread."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        cache_dir: Path,
        *,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        client_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token or None
        # The installation's id: while a canary runs, the backend answers this client's arm.
        self._params = {"install_id": client_key} if client_key else {}
        self.root = Path(cache_dir)
        self._timeout_s = timeout_s
        self._transport = transport
        self._client: httpx.Client | None = None
        self._etag: str | None = None
        self.serving = self._load_state()

    def fetch(self) -> Fetched:
        """The version the backend serves now, with its files here and checked."""
        try:
            return self._fetch()
        except httpx.HTTPStatusError as exc:
            detail = _detail(exc.response)
            raise AdapterFetchError(
                f"{exc.request.url.path} answered {exc.response.status_code}: {detail}"
            ) from None
        except httpx.HTTPError as exc:
            raise AdapterFetchError(f"the backend is unreachable: {exc}") from None
        except OSError as exc:
            raise AdapterFetchError(f"cannot keep the adapter in {self.root}: {exc}") from None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- internals ------------------------------------------------------------------------

    def _http(self) -> httpx.Client:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            self._client = httpx.Client(
                base_url=self.base_url,
                headers=headers,
                timeout=self._timeout_s,
                transport=self._transport,
            )
        return self._client

    def _fetch(self) -> Fetched:
        headers = {"If-None-Match": self._etag} if self._etag else {}
        answer = self._http().get("/v1/model", headers=headers, params=self._params)
        if answer.status_code == 304:
            return self.serving
        answer.raise_for_status()
        try:
            body = answer.json()
            version, checksum, files = body["version"], body["checksum"], body["files"]
        except (ValueError, KeyError, TypeError):
            raise AdapterFetchError("/v1/model answered something that is not a model") from None
        if version is None:
            fetched = Fetched(None, None, None)
        else:
            fetched = self._download(str(version), str(checksum), files)
        self._etag = answer.headers.get("etag")
        if fetched != self.serving:
            self._save_state(fetched)
            self._prune(keep=fetched)
        self.serving = fetched
        return fetched

    def _download(self, version: str, checksum: str, files: Any) -> Fetched:
        if not _NAME.match(version) or not re.fullmatch(r"[0-9a-f]{64}", checksum):
            raise AdapterFetchError(f"/v1/model named an impossible version {version!r}")
        if not isinstance(files, dict) or not all(
            isinstance(files.get(name), str) for name in (CONFIG, WEIGHTS)
        ):
            raise AdapterFetchError("/v1/model did not give the checksums of the adapter's files")
        target = self.root / f"{version}-{checksum[:16]}"
        wanted = {CONFIG: files[CONFIG], WEIGHTS: files[WEIGHTS], MANIFEST: checksum}
        if target.is_dir() and _matches(target, wanted):
            return Fetched(version, target, checksum)  # fetched before (a restart, a rollback)
        self.root.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=self.root))
        try:
            for name, digest in wanted.items():
                got = self._download_file(name, work / name)
                if got != digest:
                    raise AdapterFetchError(
                        f"{name} of adapter {version} does not match the checksum the backend "
                        "announced (changed while it was fetched, or damaged on the way)"
                    )
            try:
                manifest = verify_adapter(work)
            except AdapterError as exc:
                raise AdapterFetchError(str(exc)) from None
            if manifest["files"].get(WEIGHTS) != files[WEIGHTS]:
                raise AdapterFetchError(f"the manifest of adapter {version} names other weights")
            if target.exists():
                shutil.rmtree(target)
            os.rename(work, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return Fetched(version, target, checksum)

    def _download_file(self, name: str, path: Path) -> str:
        """Stream one file to `path`; its SHA-256."""
        digest = hashlib.sha256()
        size = 0
        with self._http().stream("GET", f"/v1/model/files/{name}", params=self._params) as answer:
            if answer.status_code != 200:
                answer.read()
                answer.raise_for_status()
            with path.open("wb") as handle:
                for block in answer.iter_bytes(1 << 20):
                    size += len(block)
                    if size > MAX_FILE_BYTES:
                        raise AdapterFetchError(f"{name} is larger than {MAX_FILE_BYTES} bytes")
                    digest.update(block)
                    handle.write(block)
                handle.flush()
                os.fsync(handle.fileno())
        return digest.hexdigest()

    def _load_state(self) -> Fetched:
        """What served when this cache was last used, if its files still check out."""
        try:
            state = json.loads((self.root / STATE_FILE).read_text())
            version, checksum = state["version"], state["checksum"]
        except (OSError, ValueError, KeyError, TypeError):
            return Fetched(None, None, None)
        if version is None or not isinstance(checksum, str):
            return Fetched(None, None, None)
        target = self.root / f"{version}-{checksum[:16]}"
        try:
            verify_adapter(target)
        except AdapterError:
            return Fetched(None, None, None)  # damaged since: fetched again from the backend
        if not _matches(target, {MANIFEST: checksum}):
            return Fetched(None, None, None)
        return Fetched(str(version), target, checksum)

    def _save_state(self, fetched: Fetched) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        state = {"version": fetched.version, "checksum": fetched.checksum}
        handle, temporary = tempfile.mkstemp(prefix=".serving.", dir=self.root)
        with os.fdopen(handle, "w") as out:
            json.dump(state, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, self.root / STATE_FILE)

    def _prune(self, keep: Fetched) -> None:
        """Remove fetched versions beyond the newest `KEPT_VERSIONS` (the serving one stays)."""
        others = sorted(
            (
                path
                for path in self.root.iterdir()
                if path.is_dir() and not path.name.startswith(".") and path != keep.path
            ),
            key=lambda path: path.stat().st_mtime,
            reverse=True,
        )
        for path in others[KEPT_VERSIONS - 1 :]:
            shutil.rmtree(path, ignore_errors=True)
        for path in self.root.glob(".v*"):  # downloads a killed process left half-way
            if path.is_dir() and time.time() - path.stat().st_mtime > STALE_DOWNLOAD_S:
                shutil.rmtree(path, ignore_errors=True)


def _matches(directory: Path, digests: dict[str, str | None]) -> bool:
    """Every file in `digests` is in `directory` with that SHA-256."""
    for name, expected in digests.items():
        path = directory / name
        if expected is None or not path.is_file():
            return False
        with path.open("rb") as handle:
            if hashlib.file_digest(handle, "sha256").hexdigest() != expected:
                return False
    return True


def _detail(response: httpx.Response) -> str:
    try:
        return str(response.json().get("detail", response.text))[:200]
    except ValueError:
        return response.text[:200]
