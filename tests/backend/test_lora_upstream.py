"""Tenants' adapters served on a multi-LoRA server behind `POST /v1/completions`, on loopback:
the real backend in front of a scripted server that speaks vLLM's dynamic LoRA protocol."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from backend.adapters.registry import TenantAdapterRegistry
from backend.adapters.run import tenant_registry
from backend.local import LocalBackend
from backend.services.lora_upstream import FALLBACK_METRIC, LoraUpstream
from backend.settings import BackendSettings, LoraUpstreamSettings
from completion.adapters import WEIGHTS
from completion.runners.http import HttpRunner
from completion.types import CancelToken
from tests.support.fake_adapter import FAKE_BASE_MODEL, damage_blob, fake_adapter
from tests.support.lora_server import BASE_WEIGHTS, LoraServer, weights_digest
from training.canary import on_canary_arm

BASE = "base-model"
RETIRE_S = 600.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Team:
    """The backend with two tenants, its upstream and a clock the upstream's component reads."""

    backend: LocalBackend
    server: LoraServer
    clock: FakeClock
    cache: Path
    tokens: dict[str, str]
    adapters_dir: Path

    def registry(self, tenant: str) -> TenantAdapterRegistry:
        return tenant_registry(self.backend.storage, self.cache, tenant)

    def add_version(self, tenant: str, fill: int, *, canary_share: float = 0.0) -> Path:
        """A new adapter version for `tenant` (weights all `fill`), promoted; its files."""
        registry = self.registry(tenant)
        source = fake_adapter(self.adapters_dir / f"{tenant}-{fill}", fill=fill)
        record = registry.add(source, FAKE_BASE_MODEL, {})
        registry.promote(record.version, force=True, canary_share=canary_share)
        return registry.path(record.version)

    def complete(
        self, tenant: str, *, stream: bool = False, **fields: object
    ) -> tuple[str, httpx.Headers]:
        """The text the backend answers `tenant`'s request with, and the headers."""
        body = {"prompt": "def f():", "max_tokens": 8, "stream": stream, **fields}
        headers = {"Authorization": f"Bearer {self.tokens[tenant]}"}
        url = f"{self.backend.url}/v1/completions"
        if not stream:
            answer = httpx.post(url, json=body, headers=headers, timeout=30)
            assert answer.status_code == 200, answer.text
            return str(answer.json()["choices"][0]["text"]), answer.headers
        text = ""
        with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as answer:
            assert answer.status_code == 200
            for line in answer.iter_lines():
                if line.startswith("data: {"):
                    text += json.loads(line[len("data: ") :])["choices"][0]["text"]
            return text, answer.headers

    def metric(self, reason: str) -> float:
        return self.backend.services.metrics.value(FALLBACK_METRIC, reason=reason)


@pytest.fixture
def team(tmp_path: Path) -> Iterator[Team]:
    cache = tmp_path / "cache"
    upstream = LoraUpstreamSettings(
        url="pending",  # replaced below, once the server's port is known
        api_key="upstream-key",
        base_model=BASE,
        stage_dir=tmp_path / "stage",
        retire_after_s=RETIRE_S,
    )
    with LoraServer(base_model=BASE, api_key="upstream-key") as server:
        upstream = upstream.model_copy(update={"url": server.url})
        settings = BackendSettings(
            db_url=f"sqlite:///{tmp_path / 'db.sqlite3'}", cache_dir=cache, lora_upstream=upstream
        )
        with LocalBackend(settings.db_url, tenant="acme", settings=settings) as backend:
            services = backend.services
            assert services.lora_upstream is not None  # built from the settings
            services.lora_upstream.close()
            clock = FakeClock()
            services.lora_upstream = LoraUpstream(
                upstream,
                services.served_adapters,
                tmp_path / "stage",
                services.metrics,
                clock=clock,
            )
            tokens = {"acme": backend.token, "globex": backend.storage.create_token("globex")}
            yield Team(backend, server, clock, cache, tokens, tmp_path / "sources")
            services.lora_upstream.close()


def _says(model: str, weights: str) -> str:
    return f"[{model} {weights}]"


def test_a_tenant_without_an_adapter_gets_the_base_model(team: Team) -> None:
    text, headers = team.complete("acme")
    assert text == _says(BASE, BASE_WEIGHTS)
    assert headers["X-Tabloop-Model-Version"] == "base"
    assert "X-Tabloop-Adapter-Fallback" not in headers
    assert team.server.calls_to("/v1/load_lora_adapter") == []


def test_the_tenants_version_is_loaded_once_and_named_in_every_request(team: Team) -> None:
    files = team.add_version("acme", fill=1)
    text, headers = team.complete("acme")
    (load,) = team.server.calls_to("/v1/load_lora_adapter")
    name = load["lora_name"]
    assert name.startswith("tenant-acme-v0001-")
    # The server read the version's own weights, from the staging directory it was told.
    assert team.server.loaded[name] == weights_digest(files)
    assert load["lora_path"] == str(team.backend.services.settings.lora_upstream.stage_dir / name)
    assert text == _says(name, weights_digest(files))
    assert headers["X-Tabloop-Model-Version"] == "v0001"
    assert headers["X-Tabloop-Adapter-Arm"] == "serving"

    streamed, _ = team.complete("acme", stream=True)
    assert streamed == text
    # The client's own `model` never picks the weights.
    named, _ = team.complete("acme", model=BASE)
    assert named == text
    assert team.server.completion_models() == [name] * 3
    assert len(team.server.calls_to("/v1/load_lora_adapter")) == 1


def test_the_language_servers_http_runner_gets_the_tenants_adapter(team: Team) -> None:
    files = team.add_version("acme", fill=3)
    runner = HttpRunner(
        f"{team.backend.url}/v1", api_key=team.tokens["acme"], model="qwen", timeout_s=30
    )
    try:
        result = runner.generate(
            "def f():", max_new_tokens=8, stop=lambda text: None, cancel=CancelToken()
        )
    finally:
        runner.close()
    (name,) = team.server.loaded
    assert result.text == _says(name, weights_digest(files))
    assert result.stop_reason == "eos"


def test_a_promotion_loads_the_new_version_and_the_old_one_is_retired(team: Team) -> None:
    first = team.add_version("acme", fill=1)
    old, _ = team.complete("acme")
    second = team.add_version("acme", fill=2)
    new, headers = team.complete("acme")
    assert headers["X-Tabloop-Model-Version"] == "v0002"
    loads = [call["lora_name"] for call in team.server.calls_to("/v1/load_lora_adapter")]
    assert [name.split("-")[2] for name in loads] == ["v0001", "v0002"]
    assert old == _says(loads[0], weights_digest(first))
    assert new == _says(loads[1], weights_digest(second))
    assert team.server.calls_to("/v1/unload_lora_adapter") == []  # v0001 may still be in flight

    team.clock.now += RETIRE_S / 2
    team.complete("acme")
    team.clock.now += RETIRE_S / 2 + 1
    team.complete("acme")  # v0002 was asked for a moment ago: only v0001 is idle long enough
    assert team.server.calls_to("/v1/unload_lora_adapter") == [{"lora_name": loads[0]}]
    assert sorted(team.server.loaded) == [loads[1]]


def test_two_tenants_never_cross(team: Team) -> None:
    files = {"acme": team.add_version("acme", fill=1), "globex": team.add_version("globex", fill=2)}
    answers: list[tuple[str, str]] = []
    lock = threading.Lock()

    def ask(tenant: str) -> None:
        for _ in range(4):
            text, _ = team.complete(tenant, stream=tenant == "globex")
            with lock:
                answers.append((tenant, text))

    askers = [threading.Thread(target=ask, args=(t,)) for t in ("acme", "globex") * 2]
    for asker in askers:
        asker.start()
    for asker in askers:
        asker.join(60)
    assert len(answers) == 16
    names = {tenant: f"tenant-{tenant}-v0001-" for tenant in files}
    for tenant, text in answers:
        assert text.startswith(f"[{names[tenant]}"), (tenant, text)
        assert text.endswith(f" {weights_digest(files[tenant])}]"), (tenant, text)
    # One load per tenant however many requests waited for it.
    assert len(team.server.calls_to("/v1/load_lora_adapter")) == 2
    # Naming the other tenant's adapter in the request changes nothing.
    (acme_name,) = [name for name in team.server.loaded if name.startswith(names["acme"])]
    text, _ = team.complete("globex", model=acme_name)
    assert text.endswith(f" {weights_digest(files['globex'])}]")


def _keys(version: int, share: float) -> tuple[str, str]:
    """An installation id on the canary's arm and one on the serving arm."""
    keys = [f"install-{n}" for n in range(200)]
    on = next(k for k in keys if on_canary_arm(k, version, share))
    off = next(k for k in keys if not on_canary_arm(k, version, share))
    return on, off


def test_a_canary_installation_gets_the_canarys_adapter(team: Team) -> None:
    serving = team.add_version("acme", fill=1)
    canary = team.add_version("acme", fill=2, canary_share=0.5)
    on, off = _keys(2, 0.5)
    text, headers = team.complete("acme", user=on)
    assert headers["X-Tabloop-Model-Version"] == "v0002"
    assert headers["X-Tabloop-Adapter-Arm"] == "canary"
    assert text.endswith(f" {weights_digest(canary)}]")
    text, headers = team.complete("acme", user=off, stream=True)
    assert headers["X-Tabloop-Model-Version"] == "v0001"
    assert headers["X-Tabloop-Adapter-Arm"] == "serving"
    assert text.endswith(f" {weights_digest(serving)}]")
    # Without an installation id (or with a `user` that is not one): the serving version.
    assert team.complete("acme")[1]["X-Tabloop-Model-Version"] == "v0001"
    assert team.complete("acme", user="not an id!")[1]["X-Tabloop-Model-Version"] == "v0001"
    # The language server's HttpRunner names its installation, so it lands on its arm too.
    for user, files, version in ((on, canary, "v0002"), (off, serving, "v0001")):
        runner = HttpRunner(
            f"{team.backend.url}/v1", api_key=team.tokens["acme"], user=user, timeout_s=30
        )
        try:
            result = runner.generate(
                "def f():", max_new_tokens=8, stop=lambda text: None, cancel=CancelToken()
            )
        finally:
            runner.close()
        assert result.text.endswith(f" {weights_digest(files)}]")
        assert result.model_version == version  # what its decision events will carry


def test_a_failed_load_falls_back_to_the_base_model_visibly(
    team: Team, caplog: pytest.LogCaptureFixture
) -> None:
    files = team.add_version("acme", fill=1)
    team.server.refuse_loads = "CUDA out of memory"
    with caplog.at_level(logging.WARNING, logger="backend.services.lora_upstream"):
        text, headers = team.complete("acme")
        again, _ = team.complete("acme", stream=True)
    assert text == again == _says(BASE, BASE_WEIGHTS)
    assert headers["X-Tabloop-Model-Version"] == "base"
    assert "CUDA out of memory" in headers["X-Tabloop-Adapter-Fallback"]
    assert "v0001" in headers["X-Tabloop-Adapter-Fallback"]
    assert team.metric("load_failed") == 2
    warnings = [r for r in caplog.records if "base model serves instead" in r.getMessage()]
    assert len(warnings) == 1  # once, not per request
    assert len(team.server.calls_to("/v1/load_lora_adapter")) == 1  # not retried at once

    team.server.refuse_loads = None
    team.clock.now += team.backend.services.settings.lora_upstream.retry_s + 1
    text, headers = team.complete("acme")
    assert headers["X-Tabloop-Model-Version"] == "v0001"
    assert text.endswith(f" {weights_digest(files)}]")
    assert "X-Tabloop-Adapter-Fallback" not in headers


def test_a_damaged_version_is_never_sent_the_base_model_serves(team: Team) -> None:
    files = team.add_version("acme", fill=1)
    damage_blob(team.registry("acme"), 1)  # in the blob store, and in this instance's copy
    (files / WEIGHTS).write_bytes(b"not these weights")
    text, headers = team.complete("acme")
    assert text == _says(BASE, BASE_WEIGHTS)
    assert "damaged" in headers["X-Tabloop-Adapter-Fallback"]
    assert team.server.calls_to("/v1/load_lora_adapter") == []
    assert team.metric("unservable") == 1


def test_an_upstream_that_lost_its_adapters_is_given_them_again(team: Team) -> None:
    files = team.add_version("acme", fill=1)
    first, _ = team.complete("acme")
    team.server.restart()
    again, headers = team.complete("acme", stream=True)
    assert again == first and headers["X-Tabloop-Model-Version"] == "v0001"
    assert len(team.server.calls_to("/v1/load_lora_adapter")) == 2
    assert again.endswith(f" {weights_digest(files)}]")


def test_a_name_another_instance_loaded_counts_as_loaded(team: Team) -> None:
    team.add_version("acme", fill=1)
    team.complete("acme")
    (name,) = team.server.loaded
    upstream = team.backend.services.lora_upstream
    assert upstream is not None
    upstream.forget(name)  # as a second instance that never loaded it sees the server
    text, headers = team.complete("acme")
    assert headers["X-Tabloop-Model-Version"] == "v0001" and text.startswith(f"[{name} ")
    assert "X-Tabloop-Adapter-Fallback" not in headers
