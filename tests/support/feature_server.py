"""A stand-in for `TabloopServer` with only what the learning and adapter features use."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from lsp_server.capabilities import ResolvedClientCapabilities
from lsp_server.config import Settings
from lsp_server.server import TabloopServer


class FeatureServer(SimpleNamespace):
    _import_lock = threading.Lock()
    import_libraries = TabloopServer.import_libraries

    def run_task(self, coro: Any, name: str) -> Any:
        return asyncio.ensure_future(coro)

    def add_feature(self, feature: Any) -> Any:
        """As the real server: findable by its class (`find_feature`)."""
        self.__dict__.setdefault("features", {})[type(feature)] = feature
        return feature

    def find_feature(self, kind: type[Any]) -> Any:
        return self.__dict__.get("features", {}).get(kind)


def feature_server(tmp_path: Path, rows: int = 100, engine: Any = None) -> FeatureServer:
    settings = Settings.model_validate(
        {"cacheDir": str(tmp_path / "cache"), "completion": {"feedbackRows": rows}}
    )
    return FeatureServer(
        settings=settings,
        workspace_root=tmp_path / "ws",
        engine=engine,
        model_executor=ThreadPoolExecutor(1),
        client=ResolvedClientCapabilities(),
    )
