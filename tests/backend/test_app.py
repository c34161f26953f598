"""`create_app`: services built once per app, started and stopped by its one lifespan."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

import backend.policy.loop
import backend.services.container
from backend.app import create_app
from backend.policy.registry import PolicyRegistry
from backend.policy.settings import TrainerSettings
from backend.settings import BackendSettings
from backend.storage import Storage
from completion.settings import CompletionSettings
from completion.types import CancelToken, Generation, StopRule

TRAINER_THREAD = "tabloop-trainer"


class IdleRunner:
    """A model that is never asked to generate: records its load and its release."""

    model_id = "idle"
    family = "qwen"

    def __init__(self) -> None:
        self.closed = threading.Event()

    def count_tokens(self, text: str) -> int:
        return len(text)

    def generate(
        self,
        prompt: str,
        *,
        max_new_tokens: int,
        stop: StopRule,
        cancel: CancelToken,
        temperature: float = 0.0,
    ) -> Generation:
        raise AssertionError("not asked to generate")

    def close(self) -> None:
        self.closed.set()


def _trainer_running() -> bool:
    return any(thread.name == TRAINER_THREAD for thread in threading.enumerate())


@pytest.fixture
def registries(monkeypatch: pytest.MonkeyPatch) -> list[PolicyRegistry]:
    """Every `PolicyRegistry` made from now on, wherever the backend makes one."""
    made: list[PolicyRegistry] = []

    class Counted(PolicyRegistry):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(backend.services.container, "PolicyRegistry", Counted)
    monkeypatch.setattr(backend.policy.loop, "PolicyRegistry", Counted)
    return made


def test_the_app_builds_its_services_once_and_its_lifespan_runs_them(
    tmp_path: Path, registries: list[PolicyRegistry]
) -> None:
    runner = IdleRunner()
    loads: list[Path] = []

    def loader(settings: CompletionSettings, cache_dir: Path) -> IdleRunner:
        loads.append(cache_dir)
        return runner

    app = create_app(
        BackendSettings(
            db_url=f"sqlite:///{tmp_path / 'backend.sqlite3'}",
            trainer=TrainerSettings.model_validate({"interval_s": 3600, "show_floor": 0.2}),
            train=True,
            preload_model=True,
            cache_dir=tmp_path / "cache",
        ),
        runner_loader=loader,
    )
    services = app.services
    assert services.trainer is not None
    assert registries == [services.registry]  # one, shared by the routes and the trainer
    assert services.trainer.registry is services.registry
    token = services.storage.create_token("tenant")
    assert not _trainer_running()  # nothing runs before the app starts

    with TestClient(app) as client:
        assert _trainer_running()
        deadline = time.monotonic() + 10
        while not loads and time.monotonic() < deadline:  # preloaded, not asked for
            time.sleep(0.01)
        assert loads == [tmp_path / "cache"]
        headers = {"Authorization": f"Bearer {token}"}
        for _ in range(2):
            answer = client.get("/v1/policy", headers=headers)
            assert answer.status_code == 200
            assert answer.json()["show_floor"] == pytest.approx(0.2)  # the trainer's floor
        assert client.get("/healthz").status_code == 200
        assert services.metrics.value("tabloop_requests_unauthorized_total") == 0
        assert client.get("/v1/policy").status_code == 401
        assert services.metrics.value("tabloop_requests_unauthorized_total") == 1
        assert app.services is services and len(registries) == 1  # nothing built per request

    assert not _trainer_running()  # stopped with the app
    assert runner.closed.is_set()  # the model released
    assert loads == [tmp_path / "cache"]


def test_a_process_that_does_not_train_serves_without_a_trainer(
    tmp_path: Path, registries: list[PolicyRegistry]
) -> None:
    db_url = f"sqlite:///{tmp_path / 'backend.sqlite3'}"
    Storage(db_url).close()  # migrated once, as the parent of `--workers N` does
    app = create_app(BackendSettings(db_url=db_url, migrate=False))
    assert app.services.trainer is None and len(registries) == 1
    with TestClient(app) as client:
        assert client.get("/healthz").json() == {"status": "ok", "database": "sqlite"}
        assert not _trainer_running()


def test_the_app_finds_the_model_where_every_command_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without `cache_dir`, the app reads `cacheDir` through the configuration layers, like
    `tabloop backend`: the user's config.toml, with $TABLOOP_CACHE_DIR above it."""
    monkeypatch.delenv("TABLOOP_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    user_file = tmp_path / "xdg" / "tabloop" / "config.toml"
    user_file.parent.mkdir(parents=True)
    user_file.write_text(f'cacheDir = "{tmp_path / "configured"}"\n', encoding="utf-8")
    db_url = f"sqlite:///{tmp_path / 'backend.sqlite3'}"

    app = create_app(BackendSettings(db_url=db_url))
    assert app.services.completions.cache_dir == tmp_path / "configured"
    app.services.stop()

    monkeypatch.setenv("TABLOOP_CACHE_DIR", str(tmp_path / "from-env"))
    app = create_app(BackendSettings(db_url=db_url))
    assert app.services.completions.cache_dir == tmp_path / "from-env"  # the environment wins
    app.services.stop()
