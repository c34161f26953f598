"""The server follows the workspace's (or the backend's) adapter registry."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from backend.adapters.run import tenant_registry
from completion.adapters import WEIGHTS, save_adapter
from completion.cache import TypingThroughCache
from completion.runners.loading import load_model
from completion.runners.torch_runner import TorchRunner
from completion.types import CompletionRequest
from lsp_server.config import Settings
from lsp_server.features.adapters import AdapterFeature
from tests.support.adapters import strong_adapter
from tests.support.feature_server import FeatureServer, feature_server
from training.lora import LoraShape, attach_lora
from training.registry import AdapterRegistry, scope_dir


async def test_the_server_follows_promotions_and_refuses_a_damaged_adapter(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    runner = TorchRunner(str(tiny_model_path), tmp_path / "cache", threads=1)
    server = feature_server(
        tmp_path, engine=SimpleNamespace(runner=runner, cache=TypingThroughCache())
    )
    feature = AdapterFeature(server)  # type: ignore[arg-type]
    registry = AdapterRegistry(scope_dir(tmp_path / "cache", workspace=tmp_path / "ws"))
    assert feature.registry() is not None and feature.registry().root == registry.root  # type: ignore[union-attr]

    _tokenizer, model = load_model(runner.source, "float32", tmp_path / "cache")
    save_adapter(
        attach_lora(model, LoraShape(rank=2, alpha=4)), tmp_path / "a", runner.base_model_id, {}
    )
    first = registry.add(tmp_path / "a", runner.base_model_id, {})
    second = registry.add(tmp_path / "a", runner.base_model_id, {})

    await feature.follow_registry()
    assert runner.adapter is None
    registry.promote(first.version, force=True)
    await feature.follow_registry()
    assert runner.adapter == registry.root / "v0001"

    weights = registry.root / second.name / WEIGHTS
    registry.promote(second.version, force=True)
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    await feature.follow_registry()
    assert runner.adapter == registry.root / "v0001"  # the damaged one is refused

    registry.rollback()
    registry.rollback()
    await feature.follow_registry()
    assert runner.adapter is None
    runner.close()


def _strong_adapter(runner: Any, cache: Path, target: Path) -> None:
    """An adapter with large LoRA B weights (fixed seed): it changes what the model writes."""
    strong_adapter(runner.source, runner.base_model_id, cache, target)


async def test_the_fast_engine_follows_promotions_converting_off_the_model_thread(
    tmp_path: Path, tiny_model_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from completion.cache import TypingThroughCache
    from completion.runners.ct2 import Ct2Runner
    from completion.types import CancelToken

    runner = Ct2Runner(str(tiny_model_path), tmp_path / "cache", threads=1)
    base_id = runner.model_id
    typed = CompletionRequest(prefix="x = compu", suffix="\n", language="python")
    engine = SimpleNamespace(runner=runner, cache=TypingThroughCache())
    engine.cache.store(typed, "te()")  # written by the base model
    server = feature_server(tmp_path, engine=engine)
    server.model_executor = ThreadPoolExecutor(1, thread_name_prefix="model")
    feature = AdapterFeature(server)  # type: ignore[arg-type]
    registry = AdapterRegistry(scope_dir(tmp_path / "cache", workspace=tmp_path / "ws"))
    _strong_adapter(runner, tmp_path / "cache", tmp_path / "a")
    first = registry.add(tmp_path / "a", runner.base_model_id, {})
    second = registry.add(tmp_path / "a", runner.base_model_id, {})

    def complete() -> str:
        return runner.generate(
            "def add(a, b):\n    return", max_new_tokens=8, stop=lambda _t: None,
            cancel=CancelToken(),
        ).text  # fmt: skip

    base_text = complete()
    served_while_preparing: list[str] = []
    prepare = runner.prepare_adapter

    def prepare_and_serve(adapter: Path | None, **kwargs: Any) -> Any:
        # The model thread is free while the adapter is merged and converted: a request put on
        # it now is answered by the serving (base) model before the preparation ends.
        served_while_preparing.append(server.model_executor.submit(complete).result(timeout=60))
        return prepare(adapter, **kwargs)

    runner.prepare_adapter = prepare_and_serve  # type: ignore[method-assign]
    registry.promote(first.version, force=True)
    with caplog.at_level(logging.INFO):
        await feature.follow_registry()
    assert runner.adapter == registry.root / "v0001"
    assert runner.model_id == base_id.replace("+ct2-", "+v0001+ct2-")
    assert served_while_preparing == [base_text]
    assert engine.cache.find(typed) is None  # the base model's suggestions are not served
    converting = [r for r in caplog.records if "converting" in r.getMessage()]
    assert converting
    assert all((r.threadName or "").startswith("tabloop-adapter") for r in converting)
    assert complete() != base_text  # the adapter serves from the next request on

    weights = registry.root / second.name / WEIGHTS
    registry.promote(second.version, force=True)
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    served = complete()
    await feature.follow_registry()
    assert runner.adapter == registry.root / "v0001"  # the damaged one is refused
    assert complete() == served

    registry.rollback()
    registry.rollback()
    await feature.follow_registry()
    assert runner.adapter is None and runner.model_id == base_id
    assert complete() == base_text
    feature.on_shutdown()
    runner.close()


async def test_the_server_serves_its_tenants_adapter_from_the_backend(
    tmp_path: Path, tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`adapterSource` auto: the backend's serving adapter when there is one (fetched, checked,
    kept across an outage and a restart), the workspace's otherwise; `workspace` ignores the
    backend."""
    from tests.support.backend_server import BackendServer

    monkeypatch.setenv("TABLOOP_CACHE_DIR", str(tmp_path / "backend-cache"))
    runner = TorchRunner(str(tiny_model_path), tmp_path / "cache", threads=1)
    _tokenizer, model = load_model(runner.source, "float32", tmp_path / "cache")
    save_adapter(
        attach_lora(model, LoraShape(rank=2, alpha=4)), tmp_path / "a", runner.base_model_id, {}
    )
    workspace = AdapterRegistry(scope_dir(tmp_path / "cache", workspace=tmp_path / "ws"))
    workspace.promote(workspace.add(tmp_path / "a", runner.base_model_id, {}).version, force=True)

    with BackendServer(f"sqlite:///{tmp_path / 'db.sqlite3'}") as backend:
        tenant = tenant_registry(backend.storage, tmp_path / "backend-cache", backend.tenant)
        version = tenant.add(tmp_path / "a", runner.base_model_id, {}).version

        def started(source: str = "auto") -> tuple[FeatureServer, AdapterFeature]:
            server = feature_server(
                tmp_path, engine=SimpleNamespace(runner=runner, cache=TypingThroughCache())
            )
            server.settings = Settings.model_validate(
                {
                    "cacheDir": str(tmp_path / "cache"),
                    "completion": {"adapterSource": source},
                    "telemetry": {"backendUrl": backend.url, "token": backend.token},
                }
            )
            return server, AdapterFeature(server)  # type: ignore[arg-type]

        _unused, feature = started()
        await feature.follow_registry()
        assert runner.adapter == workspace.root / "v0001"  # the backend serves none

        tenant.promote(version, force=True)
        await feature.follow_registry()
        fetched = runner.adapter
        assert fetched is not None and fetched.parent.name.startswith("backend-")
        assert (fetched / WEIGHTS).read_bytes() == (tenant.path(version) / WEIGHTS).read_bytes()

        backend.stop_serving()  # an outage: the fetched version keeps serving ...
        await feature.follow_registry()
        assert runner.adapter == fetched
        feature.on_shutdown()
        runner.swap_adapter(None)
        _unused, restarted = started()  # ... and serves again after a restart
        await restarted.follow_registry()
        assert runner.adapter == fetched

        backend.start_serving()
        tenant.rollback()  # the backend serves none again: auto goes back to the workspace's
        await restarted.follow_registry()
        assert runner.adapter == workspace.root / "v0001"
        tenant.promote(version, force=True)
        await restarted.follow_registry()
        assert runner.adapter == fetched

        _unused, only_workspace = started("workspace")
        await only_workspace.follow_registry()
        assert runner.adapter == workspace.root / "v0001"
        tenant.rollback()
        _unused, only_backend = started("backend")
        await only_backend.follow_registry()
        assert runner.adapter is None  # the tenant's base model
        for each in (restarted, only_workspace, only_backend):
            each.on_shutdown()
    runner.close()


async def test_an_adapter_named_in_the_settings_serves_from_the_next_look(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    """Naming `completion.adapter` while the server runs swaps it in at once (no reload), and
    clearing it gives the promoted version back."""
    runner = TorchRunner(str(tiny_model_path), tmp_path / "cache", threads=1)
    server = feature_server(
        tmp_path, engine=SimpleNamespace(runner=runner, cache=TypingThroughCache())
    )
    feature = AdapterFeature(server)  # type: ignore[arg-type]
    _tokenizer, model = load_model(runner.source, "float32", tmp_path / "cache")
    save_adapter(
        attach_lora(model, LoraShape(rank=2, alpha=4)), tmp_path / "a", runner.base_model_id, {}
    )
    registry = AdapterRegistry(scope_dir(tmp_path / "cache", workspace=tmp_path / "ws"))
    registry.promote(registry.add(tmp_path / "a", runner.base_model_id, {}).version, force=True)
    feature.on_settings(server.settings)
    await feature.follow_registry()
    assert runner.adapter == registry.root / "v0001"

    def configure(adapter: str) -> None:
        server.settings = Settings.model_validate(
            {"cacheDir": str(tmp_path / "cache"), "completion": {"adapter": adapter}}
        )
        feature.on_settings(server.settings)

    async def settled() -> None:
        for _ in range(200):  # the follow the settings change started
            await asyncio.sleep(0.01)
            if not feature._following:
                return

    configure(str(tmp_path / "a"))
    await settled()
    assert runner.adapter == tmp_path / "a"
    configure("")
    await settled()
    assert runner.adapter == registry.root / "v0001"
    feature.on_shutdown()
    runner.close()
