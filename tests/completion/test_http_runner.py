"""HttpRunner against a real OpenAI-compatible server on loopback serving the tiny model."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from completion.fim import template_for
from completion.postprocess import stop_rule
from completion.runners.errors import RunnerError, RunnerTimeout, RunnerUnavailable
from completion.runners.http import HttpRunner
from completion.runners.torch_runner import TorchRunner
from completion.types import CancelToken, CompletionRequest
from tests.support.completion_server import Faults, ServerState, serve_completions

PREFIX = "def join_all(parts):\n    "
SUFFIX = "\n\n\ndef main():\n    pass\n"
PROMPT = template_for("qwen").build(PREFIX, SUFFIX)


def never(text: str) -> int | None:
    return None


@pytest.fixture(scope="module")
def local(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> TorchRunner:
    return TorchRunner(str(tiny_model_path), tmp_path_factory.mktemp("cache"), dtype="float32")


@pytest.fixture(scope="module")
def server(local: TorchRunner) -> Iterator[tuple[str, ServerState]]:
    with serve_completions(local) as running:
        yield running


@pytest.fixture
def state(server: tuple[str, ServerState]) -> Iterator[ServerState]:
    server[1].faults = Faults()
    server[1].requests.clear()
    server[1].cancelled.clear()
    yield server[1]
    server[1].faults = Faults()


@pytest.fixture
def runner(server: tuple[str, ServerState], state: ServerState) -> Iterator[HttpRunner]:
    client = HttpRunner(server[0], model="qwen2.5-coder-test", timeout_s=5.0)
    yield client
    client.close()


def test_streams_the_same_text_as_the_local_runner(
    runner: HttpRunner, local: TorchRunner, state: ServerState
) -> None:
    expected = local.generate(PROMPT, max_new_tokens=12, stop=never, cancel=CancelToken())
    got = runner.generate(PROMPT, max_new_tokens=12, stop=never, cancel=CancelToken())
    assert got.text == expected.text
    assert got.stop_reason == ("length" if expected.stop_reason == "length" else "eos")
    assert got.token_logprobs and all(lp == -0.5 for lp in got.token_logprobs)
    sent = state.requests[-1]
    assert sent["stream"] is True
    assert sent["max_tokens"] == 12
    assert sent["model"] == "qwen2.5-coder-test"
    assert sent["stop"] == list(template_for("qwen").stop_tokens[:4])
    assert sent["logprobs"] == 1
    assert "user" not in sent  # no installation id was given
    assert got.model_version == ""  # the server did not name a model version


def test_the_installation_id_goes_as_user(
    server: tuple[str, ServerState], state: ServerState
) -> None:
    client = HttpRunner(server[0], model="qwen2.5-coder-test", timeout_s=5.0, user="install-7")
    try:
        client.generate(PROMPT, max_new_tokens=2, stop=never, cancel=CancelToken())
    finally:
        client.close()
    assert state.requests[-1]["user"] == "install-7"


def test_identity_and_token_estimate(runner: HttpRunner) -> None:
    assert runner.family == "qwen"
    assert runner.model_id.startswith("qwen2.5-coder-test@127.0.0.1:")
    assert runner.count_tokens("abcdef") == 2
    assert runner.count_tokens("") == 0


def test_stop_rule_closes_the_stream(runner: HttpRunner, state: ServerState) -> None:
    request = CompletionRequest(prefix=PREFIX, suffix=SUFFIX, language="python")
    state.faults.stall_between_chunks_s = 0.05

    def two_chars(text: str) -> int | None:
        return 2 if len(text) >= 2 else None

    got = runner.generate(PROMPT, max_new_tokens=40, stop=two_chars, cancel=CancelToken())
    assert got.stop_reason == "stop"
    assert len(got.text) == 2
    # Closing the stream makes the server stop generating for us.
    assert state.cancelled.wait(5)
    assert stop_rule(request)  # the real rule is a plain callable too


def test_slow_server_times_out(server: tuple[str, ServerState], state: ServerState) -> None:
    state.faults.delay_before_headers_s = 20.0
    client = HttpRunner(server[0], timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(RunnerTimeout, match=r"did not finish within 0\.3s"):
        client.generate(PROMPT, max_new_tokens=8, stop=never, cancel=CancelToken())
    # Far sooner than the server would have answered (a bound, not a speed measurement).
    assert time.monotonic() - started < 10
    client.close()


def test_stalled_stream_times_out(server: tuple[str, ServerState], state: ServerState) -> None:
    state.faults.stall_between_chunks_s = 20.0
    client = HttpRunner(server[0], timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(RunnerTimeout):
        client.generate(PROMPT, max_new_tokens=20, stop=never, cancel=CancelToken())
    assert time.monotonic() - started < 10
    client.close()


def test_server_dying_mid_stream(runner: HttpRunner, state: ServerState) -> None:
    state.faults.die_after_chunks = 1
    with pytest.raises(RunnerError, match="broke off the response after"):
        runner.generate(PROMPT, max_new_tokens=20, stop=never, cancel=CancelToken())


def test_cancel_while_server_is_silent(runner: HttpRunner, state: ServerState) -> None:
    state.faults.stall_between_chunks_s = 20.0
    cancel = CancelToken()
    threading.Timer(0.3, cancel.cancel).start()
    started = time.monotonic()
    got = runner.generate(PROMPT, max_new_tokens=20, stop=never, cancel=cancel)
    assert got.stop_reason == "cancelled"
    assert time.monotonic() - started < 10
    assert state.cancelled.wait(5)


def test_cancelled_before_the_call_sends_nothing(runner: HttpRunner, state: ServerState) -> None:
    cancel = CancelToken()
    cancel.cancel()
    got = runner.generate(PROMPT, max_new_tokens=8, stop=never, cancel=cancel)
    assert got.stop_reason == "cancelled"
    assert state.requests == []


def test_http_error_status_is_reported(runner: HttpRunner, state: ServerState) -> None:
    state.faults.status = 503
    with pytest.raises(RunnerError, match=r"HTTP 503.*overloaded"):
        runner.generate(PROMPT, max_new_tokens=8, stop=never, cancel=CancelToken())


def test_server_down() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connections are refused
        client = HttpRunner(f"http://127.0.0.1:{port}/v1", timeout_s=2.0)
        with pytest.raises(RunnerUnavailable, match="not reachable"):
            client.generate(PROMPT, max_new_tokens=8, stop=never, cancel=CancelToken())
        client.close()


def test_unknown_model_name_falls_back_to_qwen(caplog: pytest.LogCaptureFixture) -> None:
    client = HttpRunner("http://127.0.0.1:9/v1", model="my-model")
    assert client.family == "qwen"
    assert "completion.fimTemplate" in caplog.text
    client.close()


def test_explicit_family_wins() -> None:
    client = HttpRunner("http://127.0.0.1:9/v1", model="qwen-whatever", family="starcoder")
    assert client.family == "starcoder"
    client.close()
