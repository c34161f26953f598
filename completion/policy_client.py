"""The editor side of policy serving: fetch the promoted policy, verify it, swap it in.

`PolicyClient.current()` is what the engine asks for on every request: a lock-free read of an
immutable `Policy`. A background thread polls `GET /v1/policy` every `refresh_s` with the entity
tag of what it holds, so an unchanged policy costs a 304. A new artefact is verified (format and
checksum) before it replaces the current one and is written to the cache directory, so the next
start serves it at once even without a backend. Anything that goes wrong (no backend, a network
error, a corrupt artefact) leaves the current policy serving.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from pathlib import Path

import httpx

from completion.gate import Policy, PolicyError, builtin_policy, from_artifact, to_artifact

log = logging.getLogger(__name__)

CACHE_FILE = "policy.json"
ETAG_FILE = "policy.etag"


class PolicyClient:
    """Keeps the serving policy current; thread-safe."""

    def __init__(
        self,
        base_url: str | None,
        token: str | None,
        cache_dir: Path,
        refresh_s: float,
        *,
        show_floor: float | None = None,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/") if base_url else None
        self.token = token or None
        self.cache_dir = Path(cache_dir)
        self.refresh_s = refresh_s
        self.show_floor = show_floor
        self._timeout_s = timeout_s
        self._transport = transport
        self._lock = threading.Lock()  # serialises refreshes; reads need no lock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._etag: str | None = None
        self._client: httpx.Client | None = None
        self.last_error: str | None = None
        self.swapped_at: float | None = None  # time.time() of the last swap
        # time.time() at which each version first served here (a replay measures its delays).
        self.first_served: dict[str, float] = {}
        self._raw_artifact = b""  # the serving policy as received, before the local floor
        self._policy = self._floored(self._load_cached() or builtin_policy())

    # -- public ---------------------------------------------------------------------------

    def current(self) -> Policy:
        """The policy to decide with now."""
        return self._policy

    def start(self) -> None:
        """Fetch now (in the background) and then every `refresh_s`."""
        if self.base_url is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="tabloop-policy", daemon=True)
        self._thread.start()

    def refresh_now(self) -> bool:
        """Ask the backend for a newer policy; True when one was swapped in."""
        if self.base_url is None:
            return False
        with self._lock:
            try:
                return self._refresh()
            except (httpx.HTTPError, PolicyError, OSError) as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("policy refresh failed, keeping %s: %s", self._policy.version, exc)
                return False

    def close(self) -> None:
        """Stop polling and release the connection."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._timeout_s + 1)
            self._thread = None
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    # -- internals ------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh_now()
            self._stop.wait(self.refresh_s)

    def _http(self) -> httpx.Client:
        if self._client is None:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            self._client = httpx.Client(
                base_url=self.base_url or "",
                headers=headers,
                timeout=self._timeout_s,
                transport=self._transport,
            )
        return self._client

    def _refresh(self) -> bool:
        headers = {"If-None-Match": self._etag} if self._etag else {}
        response = self._http().get("/v1/policy", headers=headers)
        if response.status_code == 304:
            self.last_error = None
            return False
        response.raise_for_status()
        policy = from_artifact(response.content)  # raises on a corrupt artefact
        self.last_error = None
        etag = response.headers.get("etag")
        changed = to_artifact(policy) != self._raw_artifact
        self._etag = etag
        self._save_cache(response.content, etag)
        if not changed:
            return False
        self._policy = self._floored(policy)
        self.swapped_at = time.time()
        self.first_served.setdefault(policy.version, self.swapped_at)
        log.info("policy %s now serving", policy.version)
        return True

    def _floored(self, policy: Policy) -> Policy:
        self._raw_artifact = to_artifact(policy)
        return policy if self.show_floor is None else policy.with_floor(self.show_floor)

    def _load_cached(self) -> Policy | None:
        path = self.cache_dir / CACHE_FILE
        try:
            data = path.read_bytes()
        except OSError:
            return None
        try:
            policy = from_artifact(data)
        except PolicyError as exc:
            log.warning("cached policy %s is unusable (%s); using the built-in one", path, exc)
            return None
        try:
            self._etag = (self.cache_dir / ETAG_FILE).read_text(encoding="ascii").strip() or None
        except (OSError, UnicodeDecodeError):
            self._etag = None
        return policy

    def _save_cache(self, artifact: bytes, etag: str | None) -> None:
        # Write then rename: a crash mid-write never leaves a half policy to load next time.
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        for name, data in ((CACHE_FILE, artifact), (ETAG_FILE, (etag or "").encode())):
            fd, tmp = tempfile.mkstemp(dir=self.cache_dir, prefix=name + ".")
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                os.replace(tmp, self.cache_dir / name)
            except OSError:
                Path(tmp).unlink(missing_ok=True)
                raise
