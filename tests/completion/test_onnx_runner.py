"""The ONNX Runtime GenAI runner on the committed tiny model: the build, its failures, the kept
state across keystrokes, and the promises every runner keeps (stop rule, log-probabilities,
cancellation within a chunk of the prompt, candidates, token healing).

No test asserts what the tiny model writes (quantised kernels differ between CPUs); each compares
the runner with itself on this machine, or checks a property any output must have.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.manifest import MANIFEST, verify
from common.memory import can_release_pages, mapped_resident_kb
from completion.runners import engine_status, load_runner
from completion.runners import onnx as onnx_runner
from completion.runners.conversion import (
    ConversionError,
    checksum,
    engine_path,
    ensure_converted,
    last_failure,
)
from completion.runners.ct2 import Ct2Runner
from completion.runners.loading import resolve_source
from completion.runners.onnx import CHUNK, OnnxRunner
from completion.settings import CompletionSettings
from completion.types import CancelToken

PROMPT = "<|fim_prefix|>def add(a, b):\n    return <|fim_suffix|>\n\nprint(add(1, 2))<|fim_middle|>"
# A file typed a few characters at a time: each prompt shares a start with the one before.
BODY = "".join(f"def f{i}(x):\n    return x * {i} + f{i - 1}(x)\n\n" for i in range(1, 9))


def never(_text: str) -> int | None:
    return None


def typing_prompts(step: int = 7) -> list[str]:
    return [
        f"<|fim_prefix|>{BODY[:end]}<|fim_suffix|>\n\nprint(f8(2))<|fim_middle|>"
        for end in range(40, len(BODY), step)
    ]


class CancelAfterChecks(CancelToken):
    """Reads as cancelled from its `n`-th check on: a cancel that lands mid-prompt."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.left = n

    @property  # type: ignore[override]
    def cancelled(self) -> bool:
        self.left -= 1
        return self.left < 0


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("onnx-cache")


@pytest.fixture(scope="module")
def runner(tiny_model_path: Path, cache_dir: Path) -> Iterator[OnnxRunner]:
    loaded = OnnxRunner(str(tiny_model_path), cache_dir, threads=1, precision="int8")
    yield loaded
    loaded.close()


def test_auto_engine_is_onnxruntime_with_int8(runner: OnnxRunner, tiny_model_path: Path) -> None:
    settings = CompletionSettings(model=str(tiny_model_path), threads=1)
    loaded = load_runner(settings, runner.path.parents[2])
    assert isinstance(loaded, OnnxRunner)
    described = loaded.describe()
    assert described["engine"] == "onnxruntime-genai"
    assert described["compute_type"].startswith("int8")
    assert len(described["converted_sha256"]) == 64
    assert loaded.family == "qwen"
    assert loaded.model_id.endswith("+ort2-int8")  # layout 2: the 8-bit embedding
    status = engine_status(settings, runner.path.parents[2])  # what `tabloop doctor` reports
    assert status["engine"] == "onnxruntime" and status["converted"] is True
    assert status["converted_sha256"] == described["converted_sha256"]
    loaded.close()


def test_build_is_cached_and_verified(runner: OnnxRunner, tiny_model_path: Path) -> None:
    assert verify(runner.path) is None
    assert "model.onnx.data" in (runner.path / MANIFEST).read_text()
    mtime = (runner.path / "model.onnx.data").stat().st_mtime_ns
    again = OnnxRunner(str(tiny_model_path), runner.path.parents[2], threads=1, precision="int8")
    assert (again.path / "model.onnx.data").stat().st_mtime_ns == mtime  # not built twice
    again.close()


def test_corrupt_build_is_rebuilt_never_loaded(runner: OnnxRunner, tmp_path: Path) -> None:
    source = resolve_source(str(runner.source.location), tmp_path)
    target = ensure_converted(source, "int8", tmp_path, engine="onnxruntime")
    assert checksum(target) is not None
    weights = target / "model.onnx.data"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert verify(target) == "model.onnx.data does not match its checksum"
    settings = CompletionSettings(model=str(runner.source.location))
    assert "damaged" in engine_status(settings, tmp_path)["problem"]
    rebuilt = ensure_converted(source, "int8", tmp_path, engine="onnxruntime")
    assert verify(rebuilt) is None


def test_copy_of_an_older_layout_is_converted_again(runner: OnnxRunner, tmp_path: Path) -> None:
    import json

    import onnx

    source = resolve_source(str(runner.source.location), tmp_path)
    target = ensure_converted(source, "int8", tmp_path, engine="onnxruntime")
    model = onnx.load(str(target / "model.onnx"), load_external_data=False)
    assert "GatherBlockQuantized" in {node.op_type for node in model.graph.node}  # 8-bit embedding
    manifest = json.loads((target / MANIFEST).read_text())
    assert manifest["layout"] == 2
    del manifest["layout"]  # as copies made before layouts were recorded
    (target / MANIFEST).write_text(json.dumps(manifest))
    assert verify(target) is None  # whole, but of the first layout
    again = ensure_converted(source, "int8", tmp_path, engine="onnxruntime")
    assert json.loads((again / MANIFEST).read_text())["layout"] == 2


def test_failed_build_falls_back_to_ctranslate2_with_one_message(
    tiny_model_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("the ONNX builder failed (exit status 1): unsupported operator")

    monkeypatch.setattr("completion.runners.onnx_build.build_into", broken)
    settings = CompletionSettings(model=str(tiny_model_path), threads=1)
    with caplog.at_level(logging.WARNING):
        loaded = load_runner(settings, tmp_path)
    assert isinstance(loaded, Ct2Runner)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "unsupported operator" in warnings[0] and "CTranslate2" in warnings[0]
    failure = last_failure(str(tiny_model_path), "onnxruntime:int8", tmp_path)
    assert failure is not None and "unsupported operator" in failure
    status = engine_status(settings, tmp_path)
    assert status["engine"] == "ctranslate2"
    assert "unsupported operator" in status["problem"]
    source = resolve_source(str(tiny_model_path), tmp_path)
    assert not engine_path(source, "int8", tmp_path, "onnxruntime").exists()
    loaded.close()
    # Asked for by name, the engine's failure is an error, not a silent fallback.
    with pytest.raises(ConversionError):
        load_runner(settings.model_copy(update={"engine": "onnxruntime"}), tmp_path)


def test_generation_keeps_the_runner_promises(runner: OnnxRunner) -> None:
    result = runner.generate(PROMPT, max_new_tokens=12, stop=never, cancel=CancelToken())
    assert result.prompt_tokens == runner.count_tokens(PROMPT)
    assert 1 <= result.new_tokens <= 12
    assert len(result.token_logprobs) == result.new_tokens
    assert all(lp <= 0.0 for lp in result.token_logprobs)
    assert result.stop_reason in ("length", "eos")
    assert "<|" not in result.text
    assert result.prefill_done
    again = runner.generate(PROMPT, max_new_tokens=12, stop=never, cancel=CancelToken())
    assert again.text == result.text
    assert again.token_logprobs == result.token_logprobs


def test_giving_back_the_weights_files_pages_changes_no_answer(
    tiny_model_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After loading, the runner gives back the pages of its weights file that the engine read
    while packing its matrices; whatever the engine reads from the file later comes back from it,
    so every answer is the one a runner that kept the pages gives. One runner at a time: the
    kernel keeps a page that another mapping still holds."""
    prompts = typing_prompts(step=40)
    monkeypatch.setattr(onnx_runner, "release_weights_file", lambda _path: None)
    kept = OnnxRunner(str(tiny_model_path), cache_dir, threads=1, reuse_prefix=False)
    try:
        weights = kept.path / "model.onnx.data"
        held = mapped_resident_kb(weights)
        theirs = [
            kept.generate(prompt, max_new_tokens=10, stop=never, cancel=CancelToken())
            for prompt in prompts
        ]
    finally:
        kept.close()
    monkeypatch.undo()
    released = OnnxRunner(str(tiny_model_path), cache_dir, threads=1, reuse_prefix=False)
    try:
        if can_release_pages():
            assert held > 0 and mapped_resident_kb(weights) < held  # given back at load
        for prompt, their in zip(prompts, theirs, strict=True):
            mine = released.generate(prompt, max_new_tokens=10, stop=never, cancel=CancelToken())
            assert mine.text == their.text, prompt
            assert mine.token_logprobs == their.token_logprobs
    finally:
        released.close()


def test_stop_rule_cuts_where_it_says(runner: OnnxRunner) -> None:
    full = runner.generate(PROMPT, max_new_tokens=12, stop=never, cancel=CancelToken())
    assert len(full.text) >= 2, "the tiny model wrote too little to test a cut"
    cut_at = len(full.text) // 2

    def half(text: str) -> int | None:
        return cut_at if len(text) >= cut_at else None

    cut = runner.generate(PROMPT, max_new_tokens=12, stop=half, cancel=CancelToken())
    assert cut.text == full.text[:cut_at]
    assert cut.stop_reason == "stop"
    assert cut.token_logprobs == full.token_logprobs[: len(cut.token_logprobs)]


def test_kept_state_gives_the_text_of_a_fresh_read(
    runner: OnnxRunner, tiny_model_path: Path, cache_dir: Path
) -> None:
    """Typing on: every prompt reads only what changed, and writes exactly what a runner that
    reads every prompt whole writes."""
    fresh = OnnxRunner(
        str(tiny_model_path), cache_dir, threads=1, precision="int8", reuse_prefix=False
    )
    prompts = typing_prompts()
    read = whole = 0
    try:
        for prompt in prompts:
            kept = runner.generate(prompt, max_new_tokens=10, stop=never, cancel=CancelToken())
            plain = fresh.generate(prompt, max_new_tokens=10, stop=never, cancel=CancelToken())
            assert kept.text == plain.text, prompt
            assert kept.token_logprobs == plain.token_logprobs
            assert plain.reused_tokens == 0
            read += kept.prompt_tokens - kept.reused_tokens
            whole += plain.prompt_tokens
    finally:
        fresh.close()
    assert read < whole / 3  # the kept state served most of every prompt


def test_reading_is_cut_into_chunks_a_cancel_can_stop(runner: OnnxRunner) -> None:
    long_prompt = typing_prompts(step=10_000)[0].replace("<|fim_prefix|>", "<|fim_prefix|>" + BODY)
    assert runner.count_tokens(long_prompt) > 3 * CHUNK
    runner.generate(PROMPT, max_new_tokens=2, stop=never, cancel=CancelToken())  # another state
    # The cancel lands after two chunks: the call returns without reading the rest.
    result = runner.generate(long_prompt, max_new_tokens=8, stop=never, cancel=CancelAfterChecks(2))
    assert result.stop_reason == "cancelled" and not result.prefill_done
    assert result.text == "" and runner.kept_tokens < result.prompt_tokens
    # What was read stays kept, and the next call gives the answer of a fresh read.
    reference = runner.generate(PROMPT, max_new_tokens=8, stop=never, cancel=CancelToken())
    partial = runner.generate(long_prompt, max_new_tokens=8, stop=never, cancel=CancelToken())
    assert 0 < partial.reused_tokens < partial.prompt_tokens or partial.reused_tokens == 0
    fresh = runner.generate(long_prompt, max_new_tokens=8, stop=never, cancel=CancelToken())
    assert partial.text == fresh.text
    assert runner.generate(PROMPT, max_new_tokens=8, stop=never, cancel=CancelToken()).text == (
        reference.text
    )


def test_a_storm_of_cancellations_does_not_change_the_next_answer(runner: OnnxRunner) -> None:
    prompts = typing_prompts(step=13)
    target = prompts[-1]
    reference = runner.generate(target, max_new_tokens=16, stop=never, cancel=CancelToken())
    for index, prompt in enumerate(prompts):
        # Cancelled at every point: before starting, between chunks, between tokens.
        token = CancelAfterChecks(index % 5)
        runner.generate(prompt, max_new_tokens=16, stop=never, cancel=token)
    after = runner.generate(target, max_new_tokens=16, stop=never, cancel=CancelToken())
    assert after.text == reference.text
    assert after.token_logprobs == reference.token_logprobs


def test_candidates_start_with_the_greedy_answer_and_differ(runner: OnnxRunner) -> None:
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
    # The candidates left the prompt's state as it was.
    assert runner.generate(PROMPT, max_new_tokens=8, stop=never, cancel=CancelToken()).text == (
        greedy.text
    )


def test_forced_text_is_written_first(runner: OnnxRunner) -> None:
    prompt = PROMPT.replace("return <|fim_suffix|>", "<|fim_suffix|>")
    healed = runner.generate(
        prompt, max_new_tokens=8, stop=never, cancel=CancelToken(), forced_text="return a"
    )
    assert healed.text.startswith("return a")
    assert len(healed.token_logprobs) == healed.new_tokens


def test_a_prompt_longer_than_the_cache_gets_a_larger_one(
    runner: OnnxRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("completion.runners.onnx.MIN_LENGTH", 64)
    monkeypatch.setattr("completion.runners.onnx.LENGTH_STEP", 48)
    runner.close()  # a fresh generator, sized by the small minimum
    runner.model = runner._load(runner.path)
    short = runner.generate(PROMPT, max_new_tokens=4, stop=never, cancel=CancelToken())
    long_prompt = typing_prompts(step=10_000)[0].replace("<|fim_prefix|>", "<|fim_prefix|>" + BODY)
    tokens = runner.count_tokens(long_prompt)
    assert tokens + 4 > 64
    result = runner.generate(long_prompt, max_new_tokens=4, stop=never, cancel=CancelToken())
    assert result.prefill_done and result.prompt_tokens == tokens and result.reused_tokens == 0
    assert runner._length == -(-(tokens + 4) // 48) * 48  # the next step up, not a power of two
    again = runner.generate(long_prompt, max_new_tokens=4, stop=never, cancel=CancelToken())
    assert again.text == result.text and again.reused_tokens == tokens - 2
    assert runner.generate(PROMPT, max_new_tokens=4, stop=never, cancel=CancelToken()).text == (
        short.text
    )


def test_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        OnnxRunner(str(tmp_path / "nowhere.gguf"), tmp_path)


def test_a_runner_left_open_exits_cleanly(tiny_model_path: Path, cache_dir: Path) -> None:
    script = (
        "import sys, torch\n"
        "from pathlib import Path\n"
        "from completion.runners.onnx import OnnxRunner\n"
        "from completion.types import CancelToken\n"
        "r = OnnxRunner(sys.argv[1], Path(sys.argv[2]), threads=1, precision='int8')\n"
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
    assert int(done.stdout.split()[-1]) > 0


def test_a_rewrite_between_keystrokes_keeps_the_completion_prompt(runner: OnnxRunner) -> None:
    first, second = typing_prompts()[-2:]
    typed = runner.generate(first, max_new_tokens=4, stop=never, cancel=CancelToken())
    kept = runner.kept_tokens
    assert kept > 0 and runner.tokens_to_read(first) <= 2
    rewrite = "<|file_sep|>current/a.py\n" + BODY[:200] + "<|file_sep|>updated/a.py\n"
    edit = runner.generate_with_draft(
        rewrite, draft=BODY[:200], max_new_tokens=8, stop=never, cancel=CancelToken()
    )
    assert edit.prefill_done and edit.reused_tokens == 0
    assert runner.kept_tokens == kept  # the rewrite read into a cache of its own
    after = runner.generate(second, max_new_tokens=4, stop=never, cancel=CancelToken())
    assert after.reused_tokens >= kept - typed.new_tokens - 8  # only the typed lines read again
    again = runner.generate_with_draft(
        rewrite, draft=BODY[:200], max_new_tokens=8, stop=never, cancel=CancelToken()
    )
    assert again.text == edit.text and again.reused_tokens == edit.prompt_tokens - 2
