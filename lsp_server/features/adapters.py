"""Adapter serving in the server: the runner follows the serving adapter without a restart.

The serving adapter is the workspace's (its registry: `tabloop model promote` and `rollback`)
or, with a backend, the tenant's (`GET /v1/model`, fetched into the cache and checked file by
file; `completion.adapterSource` chooses); an adapter named in `completion.adapter` comes first.
When the serving version changes, the runner swaps base + adapter. A runner that swaps in one
step (`AdapterRunner`: torch) swaps on the model thread. One that prepares first
(`PreparingAdapterRunner`: the fast engines merge the adapter into the base weights and convert
the result, about 30 s for the bundled 0.5B model on 2 cores, once per version) prepares on a
thread of its own while the serving version keeps serving; then only the install runs on the
model thread. A damaged adapter is refused and the serving one keeps serving.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from completion.adapter_client import AdapterFetcher, AdapterFetchError
from completion.runners.base import PreparedModel, PreparingAdapterRunner, RunnerCapabilities
from completion.types import Decision
from lsp_server.config import Settings
from lsp_server.progress import WorkDoneProgress
from lsp_server.protocol import ADAPTER_PROGRESS_TITLE, ADAPTER_PROGRESS_TOKEN_PREFIX
from lsp_server.server import TabloopServer
from telemetry.client import cached_install_id
from telemetry.events import BASE_MODEL_VERSION
from training.local_canary import workspace_label
from training.registry import REGISTRY_FILE, AdapterRegistry, AdapterRegistryError, scope_dir

log = logging.getLogger(__name__)

REGISTRY_POLL_S = 30.0
NAMED_ADAPTER = "custom"
"""The model version of an adapter named in `completion.adapter` (no registry's version)."""


class AdapterFeature:
    """Follows the adapter registry (the workspace's or the backend's) and swaps the runner's."""

    def __init__(self, server: TabloopServer) -> None:
        self.server = server
        self._registry_stamp: tuple[object, ...] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._unservable_reported = False
        self._following = False
        # Fetching, merging and converting an adapter: never on the model thread.
        self._preparer: ThreadPoolExecutor | None = None
        self._fetcher_obj: AdapterFetcher | None = None
        self._fetcher_key: tuple[str, str] | None = None
        self._fetch_error: str | None = None
        self._adapter_key: tuple[object, ...] | None = None
        # Which arm of a workspace canary this server serves: one per session.
        self.session_key = uuid.uuid4().hex
        self._labels: dict[Path, str] = {}  # adapter directory -> its model version

    def model_version(self) -> str:
        """The model version serving now (`base`: no adapter, or a runner that serves none)."""
        engine = self.server.engine
        if engine is None:
            return BASE_MODEL_VERSION
        serving = RunnerCapabilities.of(engine.runner).adapters
        adapter = serving.adapter if serving is not None else None
        if adapter is None:
            return BASE_MODEL_VERSION
        return self._labels.get(adapter, NAMED_ADAPTER)

    def version_of(self, decision: Decision) -> str:
        """The model version that wrote `decision`'s suggestion: the one a remote server named
        (the backend on `runner = "http"`), else the one serving here."""
        return decision.model_version or self.model_version()

    def on_settings(self, settings: Settings) -> None:
        if self._timer is None:
            self._schedule()
        adapter_key = (
            settings.completion.adapter,
            settings.completion.adapter_source,
            settings.backend.url,
            settings.backend.token,
        )
        if self._adapter_key is not None and adapter_key != self._adapter_key:
            self._poll_now()  # which adapter serves may have changed: look now, not in 30 s
        self._adapter_key = adapter_key

    def registry(self) -> AdapterRegistry | None:
        root = self.server.workspace_root
        if root is None:
            return None
        return AdapterRegistry(scope_dir(self.server.settings.cache_path(), workspace=root))

    def _schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer = loop.call_later(REGISTRY_POLL_S, self._poll)

    def _poll(self) -> None:
        self._timer = None
        self.server.run_task(self.follow_registry(), "adapter-registry")
        self._schedule()

    def _poll_now(self) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet: the first poll comes when the model loads
        self.server.run_task(self.follow_registry(), "adapter-registry")

    async def follow_registry(self) -> None:
        """Swap the runner's adapter if the serving version (backend's or workspace's) changed."""
        if self._following:
            return  # a swap is still being prepared; the next poll looks again
        self._following = True
        try:
            await self._follow_registry()
        finally:
            self._following = False

    async def _follow_registry(self) -> None:
        engine = self.server.engine
        if engine is None:
            return  # no model yet
        runner = engine.runner
        capabilities = RunnerCapabilities.of(runner)
        serving = capabilities.adapters
        if serving is None and self._unservable_reported:
            return
        target, stamp = await self._wanted()
        if stamp == self._registry_stamp:
            return
        if serving is None:
            if target is not None and not self._unservable_reported:
                self._unservable_reported = True
                log.warning(
                    "adapter %s is promoted but %s cannot serve adapters: only the local "
                    "runner (completion.runner = local) serves them",
                    target.name,
                    engine.model_id,
                )
            return
        loop = asyncio.get_running_loop()
        if target != serving.adapter:
            preparing = capabilities.preparing_adapters
            try:
                if preparing is None:  # torch: all of it on the model thread
                    await loop.run_in_executor(
                        self.server.model_executor, serving.swap_adapter, target
                    )
                else:
                    prepared = await self._prepare(preparing, target)
                    if self.server.engine is None or self.server.engine.runner is not runner:
                        # The model was reloaded meanwhile: follow the registry on the new one.
                        self.server.run_task(self.follow_registry(), "adapter-registry")
                        return
                    await loop.run_in_executor(
                        self.server.model_executor, preparing.install, prepared
                    )
            except Exception as exc:
                log.warning("keeping the serving adapter: %s", exc)
            else:
                engine.cache.clear()  # suggestions the previous version wrote
        self._registry_stamp = stamp

    async def _wanted(self) -> tuple[Path | None, tuple[object, ...]]:
        """The adapter that should serve now (None: the base model) and a stamp that changes
        when it may have changed.

        An adapter named in `completion.adapter` comes first (the runner loaded it already,
        unless the setting changed since). Then `completion.adapterSource` decides: the tenant's
        serving adapter fetched from the backend, the workspace's promoted one, or (`auto`) the
        backend's when it serves one and the workspace's otherwise. When the backend cannot be
        reached, or what it sends does not check out, the version fetched last (kept in the
        cache) stands for it.
        """
        named = self.server.settings.completion.adapter
        if named:  # the settings name one: it serves, whatever is promoted
            path = Path(named).expanduser()
            self._labels[path] = NAMED_ADAPTER
            return path, ("setting", named)
        source = self.server.settings.completion.adapter_source
        fetcher = self._fetcher()
        if fetcher is not None:
            loop = asyncio.get_running_loop()
            try:
                remote = await loop.run_in_executor(self._preparing_thread(), fetcher.fetch)
            except AdapterFetchError as exc:
                if str(exc) != self._fetch_error:
                    log.warning("cannot fetch the backend's adapter: %s (%s)", exc, _named(fetcher))
                self._fetch_error = str(exc)
                remote = fetcher.serving
            else:
                self._fetch_error = None
            if remote.path is not None or source == "backend":
                if remote.path is not None and remote.version is not None:
                    self._labels[remote.path] = remote.version
                return remote.path, ("backend", remote.checksum)
        registry = self.registry() if source != "backend" else None
        if registry is None:
            return None, ("none",)
        path = registry.root / REGISTRY_FILE
        stamp = ("workspace", path.stat().st_mtime if path.is_file() else None)
        if stamp == self._registry_stamp:
            return None, stamp  # unchanged: nothing is swapped
        try:
            version = registry.serving_for(self.session_key)
            if version is None:
                return None, stamp
            path = registry.path(version)
            self._labels[path] = workspace_label(version)
            return path, stamp
        except AdapterRegistryError as exc:
            log.warning("keeping the serving adapter: %s", exc)
            return None, self._registry_stamp or ()

    def _fetcher(self) -> AdapterFetcher | None:
        """The fetcher of the tenant's adapter, when a backend is configured and wanted."""
        settings = self.server.settings
        url, token = settings.backend.url, settings.backend.token
        if not url or settings.completion.adapter_source == "workspace":
            return None
        key = (url, token)
        if self._fetcher_key != key:
            if self._fetcher_obj is not None:
                self._fetcher_obj.close()
            scope = hashlib.sha256(f"{url}\n{token}".encode()).hexdigest()[:16]
            root = settings.cache_path() / "adapters" / f"backend-{scope}"
            # The installation's id, as telemetry sends it: the backend's canary arm follows it.
            client = cached_install_id(settings.cache_path())
            self._fetcher_obj = AdapterFetcher(url, token or None, root, client_key=client)
            self._fetcher_key = key
        return self._fetcher_obj

    def _preparing_thread(self) -> ThreadPoolExecutor:
        if self._preparer is None:
            self._preparer = ThreadPoolExecutor(1, thread_name_prefix="tabloop-adapter")
        return self._preparer

    async def _prepare(self, runner: PreparingAdapterRunner, target: Path | None) -> PreparedModel:
        """`runner.prepare_adapter(target)` on the preparing thread, its steps logged and sent
        as `$/progress`."""
        loop = asyncio.get_running_loop()
        progress = WorkDoneProgress(
            self.server, ADAPTER_PROGRESS_TOKEN_PREFIX, ADAPTER_PROGRESS_TITLE
        )
        what = "the base model" if target is None else f"adapter {target.name}"
        await progress.begin(f"preparing {what}")

        def report(message: str) -> None:
            log.info("%s", message)
            progress.report_from_thread(loop, message)

        def run() -> PreparedModel:
            if target is not None:  # merging needs transformers, imported one thread at a time
                self.server.import_libraries(embeddings=False)
            return runner.prepare_adapter(target, progress=report)

        outcome = "adapter failed"
        try:
            prepared = await loop.run_in_executor(self._preparing_thread(), run)
            outcome = f"adapter ready: {prepared.model_id}"
            return prepared
        finally:
            progress.end(outcome)

    def on_ready(self) -> None:
        """The model (re)loaded: serve the registry's adapter on it."""
        self._registry_stamp = None
        self.server.run_task(self.follow_registry(), "adapter-registry")

    def on_shutdown(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._preparer is not None:
            self._preparer.shutdown(wait=False, cancel_futures=True)
            self._preparer = None
        if self._fetcher_obj is not None:
            self._fetcher_obj.close()
            self._fetcher_obj = None


def _named(fetcher: AdapterFetcher) -> str:
    version = fetcher.serving.version
    return "none fetched before" if version is None else f"serving {version}, fetched before"


def register(server: TabloopServer) -> None:
    feature = server.add_feature(AdapterFeature(server))
    server.hooks.settings.append(feature.on_settings)
    server.hooks.ready.append(feature.on_ready)
    server.hooks.shutdown.append(feature.on_shutdown)
