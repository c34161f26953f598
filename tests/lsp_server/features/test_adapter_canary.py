"""While an adapter canary runs, the server serves its arm (the workspace's by its session, the
backend's by its installation's id) and names the model version in what it records."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from backend.adapters.run import tenant_registry
from completion.adapters import WEIGHTS, save_adapter
from completion.cache import TypingThroughCache
from completion.runners.loading import load_model
from completion.runners.torch_runner import TorchRunner
from completion.types import CompletionRequest, Decision
from lsp_server.config import Settings
from lsp_server.features.adapters import AdapterFeature
from lsp_server.features.telemetry import decision_event
from tests.support.backend_server import BackendServer
from tests.support.feature_server import feature_server
from training.canary import on_canary_arm
from training.lora import LoraShape, attach_lora
from training.registry import AdapterRegistry, scope_dir


def _keys(version: int, share: float) -> tuple[str, str]:
    """A key on the canary's arm and one on the serving arm."""
    keys = [f"key-{n}" for n in range(100)]
    on = next(k for k in keys if on_canary_arm(k, version, share))
    off = next(k for k in keys if not on_canary_arm(k, version, share))
    return on, off


@pytest.fixture
def runner(tmp_path: Path, tiny_model_path: Path) -> TorchRunner:
    runner = TorchRunner(str(tiny_model_path), tmp_path / "cache", threads=1)
    _tokenizer, model = load_model(runner.source, "float32", tmp_path / "cache")
    save_adapter(
        attach_lora(model, LoraShape(rank=2, alpha=4)), tmp_path / "a", runner.base_model_id, {}
    )
    return runner


async def test_each_session_serves_its_arm_of_a_workspace_canary(
    tmp_path: Path, runner: TorchRunner
) -> None:
    registry = AdapterRegistry(scope_dir(tmp_path / "cache", workspace=tmp_path / "ws"))
    for _ in range(2):
        registry.add(tmp_path / "a", runner.base_model_id, {})
    registry.promote(1, force=True)
    registry.promote(2, force=True, canary_share=0.5)
    on, off = _keys(2, 0.5)
    for key, version, label in (
        (on, "v0002", "workspace:v0002"),
        (off, "v0001", "workspace:v0001"),
    ):
        server = feature_server(
            tmp_path, engine=SimpleNamespace(runner=runner, cache=TypingThroughCache())
        )
        feature = AdapterFeature(server)  # type: ignore[arg-type]
        feature.session_key = key
        await feature.follow_registry()
        assert runner.adapter == registry.root / version
        assert feature.model_version() == label
    registry.finish_canary(promote=False)
    await feature.follow_registry()  # the canary rolled back: every session serves v0001
    assert runner.adapter == registry.root / "v0001"
    runner.swap_adapter(None)
    assert feature.model_version() == "base"
    runner.close()


async def test_the_backend_canary_arm_follows_the_installation(
    tmp_path: Path, runner: TorchRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TABLOOP_CACHE_DIR", str(tmp_path / "backend-cache"))
    with BackendServer(f"sqlite:///{tmp_path / 'db.sqlite3'}") as backend:
        tenant = tenant_registry(backend.storage, tmp_path / "backend-cache", backend.tenant)
        first = tenant.add(tmp_path / "a", runner.base_model_id, {})
        second = tenant.add(tmp_path / "a", runner.base_model_id, {})
        tenant.promote(first.version, force=True)
        tenant.promote(second.version, force=True, canary_share=0.5)
        for key, version in zip(_keys(2, 0.5), ("v0002", "v0001"), strict=True):
            cache = tmp_path / f"client-{version}"
            (cache / "telemetry").mkdir(parents=True)
            (cache / "telemetry" / "install_id").write_text(key)  # the installation's id
            server = feature_server(
                tmp_path, engine=SimpleNamespace(runner=runner, cache=TypingThroughCache())
            )
            server.settings = Settings.model_validate(
                {
                    "cacheDir": str(cache),
                    "completion": {"adapterSource": "backend"},
                    "backend": {"url": backend.url, "token": backend.token},
                }
            )
            feature = AdapterFeature(server)  # type: ignore[arg-type]
            await feature.follow_registry()
            served = tenant.path(second.version if version == "v0002" else first.version)
            assert runner.adapter is not None
            assert (runner.adapter / WEIGHTS).read_bytes() == (served / WEIGHTS).read_bytes()
            assert runner.adapter.name.startswith(version)
            assert feature.model_version() == version
            # Every decision event names the version that made it.
            decision = Decision("d1", "show", "x = 1", 0.9, model_id=runner.model_id)
            request = CompletionRequest(prefix="a", suffix="", language="python")
            event = decision_event(
                decision,
                request,
                session_id="s",
                install_id=key,
                level="metrics",
                model_version=feature.model_version(),
            )
            assert event.model_version == version
            feature.on_shutdown()
    runner.close()
