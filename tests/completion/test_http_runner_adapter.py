"""`HttpRunner` naming a LoRA adapter on a vLLM-style multi-LoRA server, on loopback."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from completion.runners import load_runner
from completion.runners.errors import RunnerError
from completion.runners.http import HttpRunner
from completion.settings import CompletionSettings
from completion.types import CancelToken
from tests.support.fake_adapter import fake_adapter
from tests.support.lora_server import BASE_WEIGHTS, LoraServer, weights_digest

BASE = "Qwen/Qwen2.5-Coder-1.5B"


@pytest.fixture
def server() -> Iterator[LoraServer]:
    with LoraServer(base_model=BASE, api_key="k") as server:
        yield server


def _load(server: LoraServer, name: str, adapter: Path) -> None:
    answer = httpx.post(
        f"{server.url}/load_lora_adapter",
        json={"lora_name": name, "lora_path": str(adapter)},
        headers={"Authorization": "Bearer k"},
    )
    assert answer.status_code == 200, answer.text


def _text(runner: HttpRunner) -> str:
    result = runner.generate("x = ", max_new_tokens=8, stop=lambda t: None, cancel=CancelToken())
    return result.text


def test_the_adapter_is_named_and_the_base_serves_while_the_server_lacks_it(
    server: LoraServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    adapter = fake_adapter(tmp_path / "team", fill=7)
    settings = CompletionSettings(
        runner="http", http_url=server.url, http_model=BASE, http_adapter="team", http_api_key="k"
    )
    runner = load_runner(settings, tmp_path)
    assert isinstance(runner, HttpRunner)
    try:
        assert runner.model_id == f"{BASE}+team@{server.url.split('/')[2]}"
        assert runner.family == "qwen"  # from the base model's name
        with caplog.at_level(logging.INFO, logger="completion.runners.http"):
            assert _text(runner) == f"[{BASE} {BASE_WEIGHTS}]"
            assert _text(runner) == f"[{BASE} {BASE_WEIGHTS}]"
            _load(server, "team", adapter)
            assert _text(runner) == f"[team {weights_digest(adapter)}]"
        assert server.completion_models() == ["team", BASE, "team", BASE, "team"]
        messages = [r.getMessage() for r in caplog.records]
        assert sum("does not know adapter team" in m for m in messages) == 1  # said once
        assert sum("adapter team serves again" in m for m in messages) == 1
    finally:
        runner.close()


def test_without_a_base_model_name_the_fallback_names_none(
    server: LoraServer, tmp_path: Path
) -> None:
    runner = HttpRunner(server.url, adapter="missing", api_key="k", family="qwen")
    try:
        assert _text(runner) == f"[{BASE} {BASE_WEIGHTS}]"
        bodies = server.calls_to("/v1/completions")
        assert bodies[0]["model"] == "missing" and "model" not in bodies[1]
    finally:
        runner.close()


def test_an_error_other_than_an_unknown_adapter_is_not_hidden(
    server: LoraServer, tmp_path: Path
) -> None:
    runner = HttpRunner(server.url, model=BASE, adapter="team", api_key="wrong")
    try:
        with pytest.raises(RunnerError, match="HTTP 401"):
            _text(runner)
        assert server.completion_models() == []  # refused before any completion
    finally:
        runner.close()
