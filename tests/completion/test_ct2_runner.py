"""The CTranslate2 runner on the committed tiny model: conversion, its failures, and the promises
every runner keeps (stop rule, log-probabilities, cancellation, candidates).

No test asserts what the tiny model writes (int8 kernels differ between CPUs); each compares the
runner with itself on this machine, or checks a property any output must have.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.manifest import MANIFEST, verify
from completion.runners import engine_status, load_runner
from completion.runners.conversion import (
    ConversionError,
    checksum,
    engine_path,
    ensure_converted,
    last_failure,
)
from completion.runners.ct2 import Ct2Runner
from completion.runners.loading import resolve_source
from completion.runners.torch_runner import TorchRunner
from completion.settings import CompletionSettings
from completion.types import CancelToken

PROMPT = "<|fim_prefix|>def add(a, b):\n    return <|fim_suffix|>\n\nprint(add(1, 2))<|fim_middle|>"


def never(_text: str) -> int | None:
    return None


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ct2-cache")


@pytest.fixture(scope="module")
def runner(tiny_model_path: Path, cache_dir: Path) -> Iterator[Ct2Runner]:
    loaded = Ct2Runner(str(tiny_model_path), cache_dir, threads=1)
    yield loaded
    loaded.close()


def test_engine_ctranslate2_runs_int8(runner: Ct2Runner, tiny_model_path: Path) -> None:
    settings = CompletionSettings(model=str(tiny_model_path), threads=1, engine="ctranslate2")
    loaded = load_runner(settings, runner.path.parents[2])
    assert isinstance(loaded, Ct2Runner)
    described = loaded.describe()
    assert described["engine"] == "ctranslate2"
    assert described["compute_type"] == "int8"
    assert len(described["converted_sha256"]) == 64
    assert loaded.family == "qwen"


def test_conversion_is_cached_and_verified(runner: Ct2Runner, tiny_model_path: Path) -> None:
    assert verify(runner.path) is None
    manifest = (runner.path / MANIFEST).read_text()
    assert "model.bin" in manifest
    mtime = (runner.path / "model.bin").stat().st_mtime_ns
    again = Ct2Runner(str(tiny_model_path), runner.path.parents[2], threads=1)
    assert (again.path / "model.bin").stat().st_mtime_ns == mtime  # not converted twice


def test_corrupt_conversion_is_rebuilt_never_loaded(tiny_model_path: Path, tmp_path: Path) -> None:
    source = resolve_source(str(tiny_model_path), tmp_path)
    target = ensure_converted(source, "int8", tmp_path)
    settings = CompletionSettings(model=str(tiny_model_path), engine="ctranslate2")
    healthy = engine_status(settings, tmp_path)
    assert healthy["converted"] is True and healthy["converted_sha256"] == checksum(target)
    weights = target / "model.bin"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert verify(target) == "model.bin does not match its checksum"
    assert "damaged" in engine_status(settings, tmp_path)["problem"]
    rebuilt = ensure_converted(source, "int8", tmp_path)
    assert verify(rebuilt) is None


def test_half_converted_model_is_not_loaded(tiny_model_path: Path, tmp_path: Path) -> None:
    source = resolve_source(str(tiny_model_path), tmp_path)
    target = engine_path(source, "int8", tmp_path)
    target.mkdir(parents=True)
    (target / "model.bin").write_bytes(b"half")  # as if the manifest was never written
    stale = target.parent / f".{target.name}.killed"
    stale.mkdir()
    assert verify(target) == "no manifest (never finished converting)"
    ensure_converted(source, "int8", tmp_path)
    assert verify(target) is None
    assert not stale.exists()


def test_failed_conversion_falls_back_to_torch_with_one_message(
    tiny_model_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("unsupported architecture")

    monkeypatch.setattr("completion.runners.conversion._convert_into", broken)
    # Float weights: `auto` goes to CTranslate2 first (ONNX Runtime GenAI runs int4 and int8).
    settings = CompletionSettings(model=str(tiny_model_path), threads=1, dtype="float32")
    with caplog.at_level(logging.WARNING):
        loaded = load_runner(settings, tmp_path)
    assert isinstance(loaded, TorchRunner)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "unsupported architecture" in warnings[0]
    assert "torch runner" in warnings[0]
    failure = last_failure(str(tiny_model_path), "float32", tmp_path)
    assert failure is not None and "unsupported architecture" in failure
    status = engine_status(settings, tmp_path)  # what `tabloop doctor` reports
    assert status["engine"] == "torch"
    assert "unsupported architecture" in status["problem"]
    source = resolve_source(str(tiny_model_path), tmp_path)
    assert not engine_path(source, "float32", tmp_path).exists()
    # Asked for by name, the engine's failure is an error, not a silent fallback.
    with pytest.raises(ConversionError):
        load_runner(settings.model_copy(update={"engine": "ctranslate2"}), tmp_path)


def test_generation_keeps_the_runner_promises(runner: Ct2Runner) -> None:
    result = runner.generate(PROMPT, max_new_tokens=12, stop=never, cancel=CancelToken())
    assert result.prompt_tokens == runner.count_tokens(PROMPT)
    assert 1 <= result.new_tokens <= 12
    assert len(result.token_logprobs) == result.new_tokens
    assert all(lp <= 0.0 for lp in result.token_logprobs)
    assert result.stop_reason in ("length", "eos")
    assert "<|" not in result.text
    again = runner.generate(PROMPT, max_new_tokens=12, stop=never, cancel=CancelToken())
    assert again.text == result.text


def test_stop_rule_cuts_where_it_says(runner: Ct2Runner) -> None:
    full = runner.generate(PROMPT, max_new_tokens=12, stop=never, cancel=CancelToken())
    assert len(full.text) >= 2, "the tiny model wrote too little to test a cut"
    cut_at = len(full.text) // 2

    def half(text: str) -> int | None:
        return cut_at if len(text) >= cut_at else None

    cut = runner.generate(PROMPT, max_new_tokens=12, stop=half, cancel=CancelToken())
    assert cut.text == full.text[:cut_at]
    assert cut.stop_reason == "stop"
    assert len(cut.token_logprobs) <= len(full.token_logprobs)
    assert cut.token_logprobs == full.token_logprobs[: len(cut.token_logprobs)]


def test_cancelled_before_start_returns_nothing(runner: Ct2Runner) -> None:
    token = CancelToken()
    token.cancel()
    result = runner.generate(PROMPT, max_new_tokens=8, stop=never, cancel=token)
    assert result.stop_reason == "cancelled"
    assert result.text == ""


def test_a_storm_of_cancellations_does_not_change_the_next_answer(runner: Ct2Runner) -> None:
    reference = runner.generate(PROMPT, max_new_tokens=16, stop=never, cancel=CancelToken())
    for steps in range(1, 8):
        token = CancelToken()
        seen: list[str] = []

        def cancel_after(
            text: str, token: CancelToken = token, steps: int = steps, seen: list[str] = seen
        ) -> None:
            seen.append(text)
            if len(seen) >= steps:
                token.cancel("superseded")
            return None

        partial = runner.generate(PROMPT, max_new_tokens=16, stop=cancel_after, cancel=token)
        assert partial.new_tokens <= steps + 1
        if partial.new_tokens < reference.new_tokens:
            assert partial.stop_reason == "cancelled"
    # Cancelled from another thread while it runs, too.
    for _ in range(3):
        token = CancelToken()
        timer = threading.Timer(0.001, token.cancel)
        timer.start()
        runner.generate(PROMPT, max_new_tokens=16, stop=never, cancel=token)
        timer.join()
    after = runner.generate(PROMPT, max_new_tokens=16, stop=never, cancel=CancelToken())
    assert after.text == reference.text
    assert after.token_logprobs == reference.token_logprobs


def test_candidates_start_with_the_greedy_answer_and_differ(runner: Ct2Runner) -> None:
    greedy = runner.generate(PROMPT, max_new_tokens=8, stop=never, cancel=CancelToken())
    found = runner.generate_candidates(
        PROMPT, count=3, max_new_tokens=8, stop=never, cancel=CancelToken()
    )
    assert found[0].text == greedy.text
    assert 2 <= len(found) <= 3
    firsts = [g.token_logprobs[0] for g in found if g.token_logprobs]
    assert firsts == sorted(firsts, reverse=True)  # ranked by the first token's probability
    for candidate in found[1:]:
        assert candidate.new_tokens <= 8
        assert len(candidate.token_logprobs) == candidate.new_tokens


def test_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Ct2Runner(str(tmp_path / "nowhere.gguf"), tmp_path)


def test_conversion_survives_a_removed_cache(runner: Ct2Runner, tiny_model_path: Path) -> None:
    cache = runner.path.parents[2]
    shutil.rmtree(runner.path)
    again = Ct2Runner(str(tiny_model_path), cache, threads=1)
    assert verify(again.path) is None


def test_a_call_cancelled_after_its_prompt_still_reports_the_prompt_time(runner: Ct2Runner) -> None:
    token = CancelToken()

    def cancel_at_first(text: str) -> int | None:
        token.cancel("superseded")
        return None

    result = runner.generate(PROMPT, max_new_tokens=8, stop=cancel_at_first, cancel=token)
    assert result.stop_reason == "cancelled"
    assert result.prefill_done and result.prefill_ms > 0


def test_a_runner_left_open_does_not_abort_the_process_at_exit(
    runner: Ct2Runner, tiny_model_path: Path, cache_dir: Path
) -> None:
    """A generator that ran with a token callback and is alive at interpreter exit made the
    process abort (status 134) once torch was imported; open runners are closed at exit."""
    script = (
        "import sys, torch\n"
        "from pathlib import Path\n"
        "from completion.runners.ct2 import Ct2Runner\n"
        "from completion.types import CancelToken\n"
        "r = Ct2Runner(sys.argv[1], Path(sys.argv[2]), threads=1)\n"
        "print(r.generate(sys.argv[3], max_new_tokens=4, stop=lambda t: None,"
        " cancel=CancelToken()).prompt_tokens)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tiny_model_path), str(cache_dir), PROMPT],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[2],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) > 0 and "terminate called" not in done.stderr
