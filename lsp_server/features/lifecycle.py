"""initialize, initialized, configuration and shutdown; loading the engine in the background."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lsprotocol import types
from pygls.uris import to_fs_path

from lsp_server.server import TabloopServer

if TYPE_CHECKING:
    from completion.gate import Policy
    from completion.policy_client import PolicyClient

log = logging.getLogger(__name__)

# Fields of the completion section whose change needs a new engine.
ENGINE_FIELDS = (
    "enabled",
    "model",
    "runner",
    "http_url",
    "http_model",
    "http_api_key",
    "dtype",
    "threads",
    "cache",
    "fim_template",
)


def workspace_root(params: types.InitializeParams) -> Path | None:
    """The first workspace folder, else rootUri, else rootPath."""
    if params.workspace_folders:
        path = to_fs_path(params.workspace_folders[0].uri)
        return Path(path) if path else None
    if params.root_uri:
        path = to_fs_path(params.root_uri)
        return Path(path) if path else None
    if params.root_path:
        return Path(params.root_path)
    return None


def supports_work_done_progress(server: TabloopServer) -> bool:
    window = server.client_capabilities.window
    return bool(window and window.work_done_progress)


async def load_engine(server: TabloopServer) -> None:
    """Import torch, load the model and warm it, on the model thread; report progress."""
    from completion.engine import Engine  # heavy imports (torch) stay off `initialize`

    settings = server.settings
    if not settings.completion.enabled:
        server.model_state = "disabled"
        return
    server.model_state = "loading"
    server.engine_ready.clear()
    token = f"tabloop-model-{uuid.uuid4().hex[:8]}"
    progress = supports_work_done_progress(server)
    if progress:
        try:
            await server.work_done_progress.create_async(token)
            server.work_done_progress.begin(
                token,
                types.WorkDoneProgressBegin(
                    title="tabloop", message=f"loading {settings.completion.model}"
                ),
            )
        except Exception:
            log.debug("client refused work-done progress", exc_info=True)
            progress = False
    started = time.perf_counter()
    log.info("loading completion model %s", settings.completion.model)
    loop = asyncio.get_running_loop()
    try:
        context_source = server.extensions.get("context")

        def build() -> Engine:
            server.import_libraries()
            return Engine.load(
                settings.completion,
                settings.cache_path(),
                context_source=context_source,
                policy_source=current_policy(server),
            )

        engine = await loop.run_in_executor(server.model_executor, build)
    except Exception as exc:
        server.model_state = "error"
        server.model_error = str(exc)
        log.error("could not load the completion model: %s", exc, exc_info=True)
        server.show_message(
            f"tabloop: could not load the completion model: {exc}", types.MessageType.Error
        )
        message = "model failed to load"
    else:
        old, server.engine = server.engine, engine
        if old is not None:
            await loop.run_in_executor(server.model_executor, old.close)
        server.model_state = "ready"
        server.model_error = ""
        server.engine_ready.set()
        message = f"model ready in {time.perf_counter() - started:.1f}s"
        log.info("%s: %s", message, engine.model_id)
        for hook in server.hooks.ready:
            hook()
    if progress:
        server.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))


def ensure_policy_client(server: TabloopServer) -> PolicyClient:
    """The client that keeps the show/silence policy current, rebuilt when its settings change.

    Without a backend it serves the last cached policy, or the built-in one. Call it off the
    event loop: the policy module imports torch.
    """
    from completion.policy_client import PolicyClient

    settings = server.settings
    key = (
        settings.telemetry.backend_url,
        settings.telemetry.token,
        settings.policy.refresh_s,
        settings.policy.show_floor,
    )
    with server.policy_client_lock:
        client = server.policy_client
        if client is not None and server.policy_client_key == key:
            return client
        if client is not None:
            client.close()
        client = PolicyClient(
            settings.telemetry.backend_url or None,
            settings.telemetry.token or None,
            settings.cache_path() / "policy",
            settings.policy.refresh_s,
            show_floor=settings.policy.show_floor,
        )
        client.start()
        server.policy_client, server.policy_client_key = client, key
        return client


def current_policy(server: TabloopServer) -> Callable[[], Policy]:
    """A policy source that follows the server's policy client, whichever it is now."""

    def source() -> Policy:
        return ensure_policy_client(server).current()

    return source


async def pull_configuration(server: TabloopServer) -> None:
    """Fetch the `tabloop` section with `workspace/configuration`, when the client has it."""
    workspace = server.client_capabilities.workspace
    if not (workspace and workspace.configuration):
        return
    try:
        result = await server.workspace_configuration_async(
            types.ConfigurationParams(items=[types.ConfigurationItem(section="tabloop")])
        )
    except Exception:
        log.warning("workspace/configuration failed", exc_info=True)
        return
    server.client_config = result[0] if result else None


def engine_settings(server: TabloopServer) -> tuple[Any, ...]:
    completion = server.settings.completion
    return tuple(getattr(completion, name) for name in ENGINE_FIELDS)


def register(server: TabloopServer) -> None:
    @server.feature(types.INITIALIZE)
    def initialize(ls: TabloopServer, params: types.InitializeParams) -> None:
        # Only cheap work here: the answer must not wait for models.
        ls.workspace_root = workspace_root(params)
        ls.init_options = params.initialization_options
        ls.resolve_settings()

    @server.feature(types.INITIALIZED)
    async def initialized(ls: TabloopServer, params: types.InitializedParams) -> None:
        before = engine_settings(ls)
        await pull_configuration(ls)
        if ls.client_config is not None:
            ls.resolve_settings()
        if engine_settings(ls) != before:
            log.debug("workspace/configuration changed the engine settings")
        ls.run_task(load_engine(ls), "load-engine")

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def did_change_configuration(
        ls: TabloopServer, params: types.DidChangeConfigurationParams
    ) -> None:
        before = engine_settings(ls)
        await pull_configuration(ls)
        if ls.client_config is None and isinstance(params.settings, dict):
            # Clients without workspace/configuration push the settings here instead.
            ls.client_config = params.settings
        ls.resolve_settings()
        if engine_settings(ls) != before:
            ls.run_task(load_engine(ls), "reload-engine")
        elif ls.engine is not None:
            # Budgets, lengths and timeouts apply from the next request on.
            ls.engine.settings = ls.settings.completion
            await asyncio.get_running_loop().run_in_executor(None, ensure_policy_client, ls)

    @server.feature(types.SHUTDOWN)
    async def shutdown(ls: TabloopServer, params: None) -> None:
        await ls.shutdown_features()
