"""Serving tenants' adapters on a multi-LoRA server behind `POST /v1/completions`.

With `lora_upstream.url` set, the backend does not run a model of its own for completions: it
forwards each request to an OpenAI-compatible server that loads LoRA adapters by name at run time
(vLLM with `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` is the reference;
docs/serving.md). For each request, `LoraUpstream.route` finds the version the asking tenant's
installation should get (`ServedAdapters.serving`: the serving version, or the canary's on its
arm), makes sure it is loaded there and answers the name to send as `model`.

- **Names.** A version is loaded as `tenant-<tenant>-v0003-<12 hex of its manifest's SHA-256>`:
  the name changes with the version and with its content, so a name can never stand for another
  tenant's adapter, or for other files of the same version (a registry rebuilt elsewhere, an
  upstream shared by several backends).
- **Files.** The upstream reads adapters from its own disk. The verified files of a version
  (`adapter_config.json`, `adapter_model.safetensors`) are copied into `stage_dir/<name>/`, checked
  against the manifest's SHA-256 once copied, and the upstream is told `upstream_dir/<name>`: the
  same directory as that server sees it (a shared mount, or the same path when both run on one
  machine). Staged copies are kept: vLLM reads them again when an adapter it evicted from its
  CPU cache is asked for.
- **Loading.** Lazily, on a tenant's first request after its version changed (a promotion, a
  canary, a rollback): `POST <url>/load_lora_adapter {lora_name, lora_path}`, one load per name
  however many requests wait for it. A load the upstream refuses because the name is there
  already (another backend instance loaded it) counts as loaded once `GET <url>/models` lists it.
- **Failures.** A version that cannot be served (its files damaged, the registry unreadable, the
  upstream refusing the load) is served by the base model instead, never by another adapter: the
  route says why (`fallback`: the response's `X-Tabloop-Adapter-Fallback` header), the log says so
  once per name, and `/metrics` counts it (`tabloop_lora_fallback_total{reason}`). A failed load is
  tried again after `retry_s`.
- **Retiring.** A name no request has been routed to for `retire_after_s` (the version before a
  promotion, a canary rolled back) is unloaded (`POST <url>/unload_lora_adapter`), checked on each
  route; a name in use keeps serving requests in flight (0: never unloaded).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from backend.metrics import Metrics
from backend.services.served_adapters import (
    SERVING_ARM,
    AdapterUnavailable,
    ServedAdapter,
    ServedAdapters,
)
from backend.settings import LoraUpstreamSettings
from completion.adapters import CONFIG, WEIGHTS
from telemetry.events import BASE_MODEL_VERSION

log = logging.getLogger(__name__)

STAGED_FILES = (CONFIG, WEIGHTS)
FALLBACK_METRIC = "tabloop_lora_fallback_total"
LOADS_METRIC = "tabloop_lora_loads_total"
_ERROR_BODY_CHARS = 300


@dataclass(frozen=True)
class UpstreamRoute:
    """Where one tenant's request goes: `model` as the upstream knows it ("" for its default),
    the version it stands for (`v0003`, or `base`), the client's arm, and why the base model
    serves instead of the tenant's adapter (None when nothing went wrong)."""

    model: str
    version: str = BASE_MODEL_VERSION
    arm: str = SERVING_ARM
    fallback: str | None = None

    @property
    def adapter(self) -> bool:
        """Whether the request names an adapter (not the base model)."""
        return self.version != BASE_MODEL_VERSION


class UpstreamLoadError(Exception):
    """An adapter the upstream did not load; the message says why, with no server path."""


class UpstreamUnavailable(Exception):
    """The upstream could not be reached for a completion; the message says so."""


def served_name(tenant: str, served: ServedAdapter) -> str:
    """The name a tenant's version is loaded under: tenant, version and content in one."""
    return f"tenant-{tenant}-{served.name}-{served.checksum[:12]}"


@dataclass
class _Loaded:
    tenant: str
    last_routed: float


class LoraUpstream:
    """Loads the tenants' serving versions on the multi-LoRA server and routes to them."""

    def __init__(
        self,
        settings: LoraUpstreamSettings,
        adapters: ServedAdapters,
        stage_dir: Path,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.adapters = adapters
        self.stage_dir = stage_dir
        self.upstream_dir = settings.upstream_dir.rstrip("/") or str(stage_dir)
        self.metrics = metrics
        self._clock = clock
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
        self._client = httpx.Client(
            base_url=settings.url.rstrip("/"),
            headers=headers,
            timeout=settings.load_timeout_s,
            transport=transport,
        )
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}
        self._loaded: dict[str, _Loaded] = {}
        self._failed: dict[str, tuple[float, str]] = {}  # name -> (retry at, why)
        self._warned: set[tuple[str, str]] = set()  # (tenant, why) logged once

    @property
    def base(self) -> UpstreamRoute:
        """The base model's route."""
        return UpstreamRoute(self.settings.base_model)

    def route(self, tenant: str, client: str | None = None) -> UpstreamRoute:
        """Where tenant `tenant`'s installation `client` is served now, its adapter loaded
        there first when needed (blocking: call from a worker thread)."""
        self._retire()
        try:
            served = self.adapters.serving(tenant, client)
        except AdapterUnavailable as exc:
            return self.fall_back(tenant, "unservable", str(exc))
        if served is None:
            return self.base
        name = served_name(tenant, served)
        try:
            self._ensure(tenant, name, served)
        except UpstreamLoadError as exc:
            return self.fall_back(tenant, "load_failed", str(exc), arm=served.arm)
        return UpstreamRoute(name, served.name, served.arm)

    def open_completion(
        self, tenant: str, client: str | None, payload: dict[str, Any]
    ) -> tuple[UpstreamRoute, httpx.Response]:
        """Send the completion `payload` (an OpenAI completions body without `model`) for the
        tenant's installation `client` to its route; returns the route and the open response
        (streamed: read or iterate it, then close it). Blocking: call from a worker thread.

        An upstream that answers 404 for an adapter's name has lost it (restarted, or unloaded
        by another instance): the name is loaded again and the request sent once more; a second
        404 sends it to the base model, and the route says why. `UpstreamUnavailable` when the
        upstream cannot be reached."""
        route = self.route(tenant, client)
        for attempt in range(2):
            response = self._send(route, payload)
            if response.status_code != 404 or not route.adapter:
                return route, response
            response.close()
            self.forget(route.model)
            if attempt == 0:
                route = self.route(tenant, client)
            else:
                why = f"the adapter server does not know {route.version} right after loading it"
                route = self.fall_back(tenant, "not_found", why, arm=route.arm)
        return route, self._send(route, payload)

    def _send(self, route: UpstreamRoute, payload: dict[str, Any]) -> httpx.Response:
        body = {**payload, "model": route.model} if route.model else dict(payload)
        request = self._client.build_request(
            "POST", "/completions", json=body, timeout=self.settings.timeout_s
        )
        try:
            return self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise UpstreamUnavailable(
                f"the completion server at {self.settings.url} is not reachable "
                f"({type(exc).__name__}: {exc})"
            ) from exc

    def forget(self, name: str) -> None:
        """`name` is not loaded upstream after all (it answered that the model does not exist:
        restarted, or another instance unloaded it): the next route loads it again."""
        with self._lock:
            self._loaded.pop(name, None)

    def loaded(self) -> list[str]:
        """The names this backend has loaded upstream and not retired."""
        with self._lock:
            return sorted(self._loaded)

    def close(self) -> None:
        """Close the connection pool (what is loaded upstream stays loaded)."""
        self._client.close()

    # --- loading ---

    def _ensure(self, tenant: str, name: str, served: ServedAdapter) -> None:
        if self._ready(name):
            return
        with self._lock:
            gate = self._loading.setdefault(name, threading.Lock())
        with gate:  # one load per name; the others wait for it and find it done
            if self._ready(name):
                return
            try:
                self._load(name, served)
            except UpstreamLoadError as exc:
                with self._lock:
                    self._failed[name] = (self._clock() + self.settings.retry_s, str(exc))
                self.metrics.inc(LOADS_METRIC, result="failed")
                raise
            with self._lock:
                self._failed.pop(name, None)
                self._loaded[name] = _Loaded(tenant, self._clock())
            self.metrics.inc(LOADS_METRIC, result="loaded")
            log.info("tenant %s: adapter %s loaded upstream as %s", tenant, served.name, name)

    def _ready(self, name: str) -> bool:
        """Whether `name` is loaded (then it was routed to now); `UpstreamLoadError` while a
        failed load waits for `retry_s`."""
        now = self._clock()
        with self._lock:
            loaded = self._loaded.get(name)
            if loaded is not None:
                loaded.last_routed = now
                return True
            failed = self._failed.get(name)
        if failed is not None and now < failed[0]:
            raise UpstreamLoadError(failed[1])
        return False

    def _load(self, name: str, served: ServedAdapter) -> None:
        self._stage(name, served)
        body = {"lora_name": name, "lora_path": f"{self.upstream_dir}/{name}"}
        try:
            answer = self._client.post("/load_lora_adapter", json=body)
        except httpx.HTTPError as exc:
            raise UpstreamLoadError(
                f"the adapter server is not reachable ({type(exc).__name__})"
            ) from None
        if answer.status_code == 200:
            return
        if name in self._listed():  # loaded already, by another instance or before a restart
            return
        raise UpstreamLoadError(
            f"the adapter server refused {served.name} (HTTP {answer.status_code}: "
            f"{_redact(answer.text[:_ERROR_BODY_CHARS], self.upstream_dir)})"
        )

    def _listed(self) -> set[str]:
        """The model names the upstream serves (`GET /models`: the base and loaded adapters)."""
        try:
            answer = self._client.get("/models")
            answer.raise_for_status()
            return {str(model.get("id")) for model in answer.json().get("data", [])}
        except (httpx.HTTPError, ValueError, AttributeError):
            return set()

    def _stage(self, name: str, served: ServedAdapter) -> None:
        """Copy the version's checked files to `stage_dir/name` (once: kept for the upstream)."""
        target = self.stage_dir / name
        expected = {file: str(served.manifest["files"][file]) for file in STAGED_FILES}
        if target.is_dir() and _digests(target) == expected:
            return
        partial = self.stage_dir / f".{name}.{uuid.uuid4().hex[:8]}"
        try:
            partial.mkdir(parents=True)
            for file in STAGED_FILES:
                shutil.copyfile(served.directory / file, partial / file)
            if _digests(partial) != expected:  # changed under us: never stage other bytes
                raise UpstreamLoadError(f"the files of {served.name} changed while staged")
            if target.exists():
                shutil.rmtree(target)  # a damaged or partial copy of the same name
            os.replace(partial, target)
        except OSError as exc:
            raise UpstreamLoadError(
                f"cannot stage {served.name} for the adapter server ({type(exc).__name__})"
            ) from None
        finally:
            shutil.rmtree(partial, ignore_errors=True)

    # --- falling back and retiring ---

    def fall_back(
        self, tenant: str, reason: str, why: str, *, arm: str = SERVING_ARM
    ) -> UpstreamRoute:
        """The base model's route for `tenant`, because of `why` (`reason` labels the metric):
        counted, and logged once per tenant and reason."""
        self.metrics.inc(FALLBACK_METRIC, tenant=tenant, reason=reason)
        with self._lock:
            first = (tenant, why) not in self._warned
            self._warned.add((tenant, why))
        if first:
            log.warning("tenant %s: the base model serves instead of its adapter: %s", tenant, why)
        return UpstreamRoute(self.settings.base_model, BASE_MODEL_VERSION, arm, why)

    def _retire(self) -> None:
        if self.settings.retire_after_s <= 0:
            return  # never unloaded by this backend
        cutoff = self._clock() - self.settings.retire_after_s
        with self._lock:
            idle = [name for name, seen in self._loaded.items() if seen.last_routed < cutoff]
            for name in idle:
                del self._loaded[name]
        for name in idle:
            try:
                answer = self._client.post("/unload_lora_adapter", json={"lora_name": name})
                gone = answer.status_code in (200, 404)
            except httpx.HTTPError:
                gone = False
            if gone:
                log.info(
                    "unloaded adapter %s upstream (not asked for in %ss)",
                    name,
                    self.settings.retire_after_s,
                )
            else:
                log.warning("could not unload adapter %s upstream; it stays loaded there", name)


def _digests(directory: Path) -> dict[str, str] | None:
    try:
        return {
            file: hashlib.sha256((directory / file).read_bytes()).hexdigest()
            for file in STAGED_FILES
        }
    except OSError:
        return None


def _redact(text: str, root: str) -> str:
    return text.replace(root, "<adapters>")
