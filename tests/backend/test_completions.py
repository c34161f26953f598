"""`POST /v1/completions` on the backend, through the LSP's own HttpRunner, with the tiny model."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from backend.deps import get_completion_service
from backend.services.completions import CompletionService, held_back
from completion.fim import template_for
from completion.runners.base import ModelRunner
from completion.runners.http import HttpRunner
from completion.runners.torch_runner import TorchRunner
from completion.settings import CompletionSettings
from completion.types import CancelToken, Generation, StopRule
from tests.support.backend_server import BackendServer

PROMPT = template_for("qwen").build("def join_all(parts):\n    ", "\n\n\ndef main():\n    pass\n")


def never(text: str) -> int | None:
    return None


class RecordingRunner:
    """The tiny model's TorchRunner, recording each generation it finished."""

    def __init__(self, runner: TorchRunner) -> None:
        self.inner = runner
        self.model_id = runner.model_id
        self.family = runner.family
        self.generations: list[Generation] = []

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def generate(
        self,
        prompt: str,
        *,
        max_new_tokens: int,
        stop: StopRule,
        cancel: CancelToken,
        temperature: float = 0.0,
    ) -> Generation:
        result = self.inner.generate(
            prompt, max_new_tokens=max_new_tokens, stop=stop, cancel=cancel, temperature=temperature
        )
        self.generations.append(result)
        return result

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def local(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> TorchRunner:
    return TorchRunner(str(tiny_model_path), tmp_path_factory.mktemp("cache"), dtype="float32")


@pytest.fixture(scope="module")
def served(
    local: TorchRunner, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[BackendServer, RecordingRunner, list[int]]]:
    """The backend serving the tiny model; yields (server, runner, loads)."""
    runner = RecordingRunner(local)
    loads: list[int] = []

    def loader(settings: CompletionSettings, cache_dir: Path) -> ModelRunner:
        time.sleep(0.2)  # a slow load, so concurrent first requests overlap it
        loads.append(1)
        return runner

    db = tmp_path_factory.mktemp("db") / "backend.sqlite3"
    service = CompletionService(CompletionSettings(), Path("/nonexistent"), loader)
    with BackendServer(f"sqlite:///{db}") as server:
        server.app.dependency_overrides[get_completion_service] = lambda: service
        yield server, runner, loads
    service.close()


@pytest.fixture
def http_runner(served: tuple[BackendServer, RecordingRunner, list[int]]) -> Iterator[HttpRunner]:
    server = served[0]
    runner = HttpRunner(f"{server.url}/v1", api_key=server.token, model="qwen", timeout_s=60)
    yield runner
    runner.close()


def test_http_runner_gets_what_the_local_runner_makes_and_the_model_loads_once(
    served: tuple[BackendServer, RecordingRunner, list[int]],
    http_runner: HttpRunner,
    local: TorchRunner,
) -> None:
    expected = local.generate(PROMPT, max_new_tokens=12, stop=never, cancel=CancelToken())
    results: list[Generation] = []

    def ask() -> None:
        results.append(
            http_runner.generate(PROMPT, max_new_tokens=12, stop=never, cancel=CancelToken())
        )

    editors = [threading.Thread(target=ask) for _ in range(3)]
    for editor in editors:
        editor.start()
    for editor in editors:
        editor.join(120)
    assert len(results) == 3 and served[2] == [1]  # three editors, one loaded model
    for result in results:
        assert result.text == expected.text
        assert result.token_logprobs == pytest.approx(expected.token_logprobs, abs=1e-4)
        assert result.prompt_tokens == expected.prompt_tokens


def _post(server: BackendServer, body: object, token: str | None = None) -> httpx.Response:
    return httpx.post(
        f"{server.url}/v1/completions",
        content=json.dumps(body) if not isinstance(body, bytes) else body,
        headers={"Authorization": f"Bearer {token or server.token}"},
        timeout=120,
    )


def _streamed(
    server: BackendServer, body: dict[str, object]
) -> tuple[str, list[dict[str, object]]]:
    events = []
    with httpx.stream(
        "POST",
        f"{server.url}/v1/completions",
        json={**body, "stream": True},
        headers={"Authorization": f"Bearer {server.token}"},
        timeout=120,
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        events.append(json.loads(line[len("data:") :]))
    text = "".join(str(e["choices"][0]["text"]) for e in events)  # type: ignore[index]
    return text, events


def test_stop_sequences_are_cut_whole_and_never_streamed_in_part(
    served: tuple[BackendServer, RecordingRunner, list[int]], local: TorchRunner
) -> None:
    server = served[0]
    free = local.generate(PROMPT, max_new_tokens=24, stop=never, cancel=CancelToken()).text
    assert len(free) > 6
    stop = free[4:7]  # a stop sequence that really occurs, after some text
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "stop": [stop]}
    whole = _post(server, body)
    assert whole.status_code == 200
    answer = whole.json()
    expected = free[: free.index(stop)]
    assert answer["choices"][0]["text"] == expected
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["prompt_tokens"] > 0
    text, events = _streamed(server, body)
    assert text == expected
    assert all(stop not in str(e["choices"][0]["text"]) for e in events)  # type: ignore[index]
    last = events[-1]["choices"][0]  # type: ignore[index]
    assert last["finish_reason"] == "stop"


def test_a_client_that_leaves_cancels_the_generation(
    served: tuple[BackendServer, RecordingRunner, list[int]],
) -> None:
    server, runner, _ = served
    before = len(runner.generations)
    with httpx.stream(
        "POST",
        f"{server.url}/v1/completions",
        json={"prompt": PROMPT, "max_tokens": 4000, "temperature": 0, "stream": True},
        headers={"Authorization": f"Bearer {server.token}"},
        timeout=60,
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data:"):
                break  # the first piece: now leave
    deadline = time.monotonic() + 60
    while len(runner.generations) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    finished = runner.generations[before:]
    assert finished and finished[0].stop_reason == "cancelled"
    assert finished[0].new_tokens < 4000


@pytest.mark.parametrize(
    ("body", "status"),
    [
        pytest.param(b"{nope", 400, id="not-json"),
        pytest.param({"max_tokens": 4}, 422, id="no-prompt"),
        pytest.param({"prompt": "x", "max_tokens": 0}, 422, id="zero-tokens"),
        pytest.param({"prompt": "x", "max_tokens": 10**6}, 422, id="too-many-tokens"),
        pytest.param({"prompt": "x", "temperature": -1}, 422, id="negative-temperature"),
        pytest.param({"prompt": "x", "n": 2}, 422, id="n"),
        pytest.param({"prompt": ["a", "b"]}, 422, id="two-prompts"),
        pytest.param({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 422, id="five-stops"),
        pytest.param({"prompt": "x" * 300_000}, 422, id="huge-prompt"),
    ],
)
def test_bad_requests_get_a_clear_4xx(
    served: tuple[BackendServer, RecordingRunner, list[int]], body: object, status: int
) -> None:
    response = _post(served[0], body)
    assert response.status_code == status, response.text
    assert response.json()["detail"]


def test_a_token_is_required(served: tuple[BackendServer, RecordingRunner, list[int]]) -> None:
    assert _post(served[0], {"prompt": "x"}, token="tl_wrong").status_code == 401


def test_held_back_keeps_what_could_begin_a_stop() -> None:
    assert held_back("abc\n", ["\n\n"]) == 1
    assert held_back("abc", ["\n\n"]) == 0
    assert held_back("x = en", ["end", "ending"]) == 2
    assert held_back("x = endin", ["ending"]) == 5
