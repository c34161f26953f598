"""initialize, initialized, configuration and shutdown; loading the engine in the background."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from lsprotocol import types
from pygls.uris import to_fs_path

from lsp_server.capabilities import ResolvedClientCapabilities
from lsp_server.features.policy import PolicyFeature
from lsp_server.progress import WorkDoneProgress
from lsp_server.protocol import (
    CONFIGURATION_SECTION,
    MODEL_PROGRESS_TITLE,
    MODEL_PROGRESS_TOKEN_PREFIX,
)
from lsp_server.retrieval import WorkspaceContext
from lsp_server.server import TabloopServer
from telemetry.client import cached_install_id

log = logging.getLogger(__name__)

# Fields of the completion section whose change needs a new engine.
ENGINE_FIELDS = (
    "enabled",
    "model",
    "runner",
    "http_url",
    "http_model",
    "http_adapter",
    "http_api_key",
    "engine",
    "dtype",
    "threads",
    "speculative",
    "speculative_tokens",
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


async def load_engine(server: TabloopServer) -> None:
    """Load the model (importing torch only if its engine needs it) on the model thread."""
    from completion.engine import Engine  # heavy imports (torch) stay off `initialize`
    from completion.runners import load_runner, needs_transformers

    settings = server.settings
    if not settings.completion.enabled:
        server.model_state = "disabled"
        return
    server.model_state = "loading"
    server.engine_ready.clear()
    progress = WorkDoneProgress(server, MODEL_PROGRESS_TOKEN_PREFIX, MODEL_PROGRESS_TITLE)
    await progress.begin(f"loading {settings.completion.model}")
    started = time.perf_counter()
    log.info("loading completion model %s", settings.completion.model)
    loop = asyncio.get_running_loop()
    policy = server.feature_of(PolicyFeature)
    context_source = server.find_feature(WorkspaceContext)

    def report(message: str) -> None:
        """A step of a first use (the fast engine's conversion), from the model thread."""
        log.info("%s", message)
        progress.report_from_thread(loop, message)

    def build() -> Engine:
        if needs_transformers(settings.completion, settings.cache_path()):
            server.import_libraries(embeddings=False)
        # The client for the settings of now (they may have changed while we waited).
        policy.follow(server.settings)
        return Engine(
            settings.completion,
            load_runner(
                settings.completion,
                settings.cache_path(),
                progress=report,
                # An OpenAI-compatible server is told the installation (the canary's arm).
                user=cached_install_id(settings.cache_path()),
            ),
            context_source=context_source,
            policy_source=policy.current,
        )

    try:
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
    progress.end(message)


async def pull_configuration(server: TabloopServer) -> None:
    """Fetch the `tabloop` section with `workspace/configuration`, when the client has it."""
    if not server.client.workspace_configuration:
        return
    try:
        result = await server.workspace_configuration_async(
            types.ConfigurationParams(
                items=[types.ConfigurationItem(section=CONFIGURATION_SECTION)]
            )
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
        ls.client_info = params.client_info
        ls.client = ResolvedClientCapabilities.resolve(params.capabilities)
        ls.protocol.trace = params.trace or types.TraceValue.Off  # pygls reads only $/setTrace
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
            ls.run_task(load_engine(ls), "reload-engine")  # which follows the policy settings
            return
        if ls.engine is not None:
            # Budgets, lengths and timeouts apply from the next request on.
            ls.engine.settings = ls.settings.completion
        policy = ls.feature_of(PolicyFeature)
        if policy.client is not None:
            # A new backend, token, refresh or floor: a new client now, off the loop (torch).
            # Before the first one exists, the engine's load builds it from the latest settings.
            await asyncio.get_running_loop().run_in_executor(None, policy.follow, ls.settings)

    @server.feature(types.SHUTDOWN)
    async def shutdown(ls: TabloopServer, params: None) -> None:
        await ls.shutdown_features()
