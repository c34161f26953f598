"""TorchRunner on the tiny Qwen2 model: decoding, stop rules, cancellation and KV-prefix reuse."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from completion.fim import template_for
from completion.postprocess import stop_rule
from completion.runners.torch_runner import TorchRunner, resolve_source
from completion.types import CancelToken, CompletionRequest
from tests.support.tiny_model import NEAR_TIE, greedy_margin

BODY_PREFIX = "import os\n\n\ndef join_all(parts):\n    "
BODY_SUFFIX = "\n\n\ndef main():\n    pass\n"


def never(text: str) -> int | None:
    return None


@pytest.fixture(scope="module")
def runner(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> TorchRunner:
    return TorchRunner(str(tiny_model_path), tmp_path_factory.mktemp("cache"), dtype="float32")


@pytest.fixture
def endless(runner: TorchRunner) -> Iterator[TorchRunner]:
    """The runner with no end-of-text token: only the test's stop rule, the token limit or
    cancellation end a generation, whatever the model would say."""
    saved, runner._stop_ids = runner._stop_ids, set()
    yield runner
    runner._stop_ids = saved


def fim_prompt(prefix: str = BODY_PREFIX, suffix: str = BODY_SUFFIX) -> str:
    return template_for("qwen").build(prefix, suffix)


def test_identity(runner: TorchRunner, tiny_model_path: Path) -> None:
    assert runner.family == "qwen"
    assert runner.model_id.startswith(f"{tiny_model_path.name}@")
    assert len(runner.model_id.split("@")[1]) == 12


def test_greedy_decoding_is_deterministic(runner: TorchRunner, tiny_model_path: Path) -> None:
    # The second run reuses the first one's KV cache, which rounds differently: the texts agree
    # on every CPU because no step of the greedy path is a near-tie.
    assert greedy_margin(tiny_model_path, fim_prompt(), 24) > NEAR_TIE
    request = CompletionRequest(prefix=BODY_PREFIX, suffix=BODY_SUFFIX, language="python")
    first = runner.generate(
        fim_prompt(), max_new_tokens=24, stop=stop_rule(request), cancel=CancelToken()
    )
    second = runner.generate(
        fim_prompt(), max_new_tokens=24, stop=stop_rule(request), cancel=CancelToken()
    )
    assert first.text == second.text, "greedy decoding is deterministic"
    assert second.token_logprobs == pytest.approx(first.token_logprobs, abs=1e-4)
    assert first.new_tokens <= 24
    assert first.stop_reason in {"stop", "eos", "length"}
    assert first.prompt_tokens == runner.count_tokens(fim_prompt())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_pick_of_a_row(runner: TorchRunner, dtype: str) -> None:
    # A row as a pass leaves it (bfloat16 rows are read as they are): the first of equal maxima,
    # as torch's argmax picks, and the token's log-probability under the whole row.
    import torch

    row = torch.tensor([0.5, 3.0, -1.0, 3.0, 2.0], dtype=getattr(torch, dtype))
    token, logprob = runner._next_token(row, 0.0)
    assert token == 1 == int(torch.argmax(row.float()))
    expected = float(torch.log_softmax(row.float(), dim=-1)[1])
    assert logprob == pytest.approx(expected, abs=1e-6)


def test_logprobs_one_per_kept_token(endless: TorchRunner) -> None:
    generation = endless.generate(fim_prompt(), max_new_tokens=12, stop=never, cancel=CancelToken())
    assert generation.stop_reason == "length"
    assert generation.new_tokens == 12
    assert len(generation.token_logprobs) == generation.new_tokens
    assert all(lp <= 0 and math.isfinite(lp) for lp in generation.token_logprobs)


def test_stop_rule_cuts_text_and_logprobs(endless: TorchRunner) -> None:
    def after_three_chars(text: str) -> int | None:
        return 3 if len(text) >= 3 else None

    generation = endless.generate(
        fim_prompt(), max_new_tokens=30, stop=after_three_chars, cancel=CancelToken()
    )
    assert generation.stop_reason == "stop"
    assert len(generation.text) == 3
    assert 1 <= len(generation.token_logprobs) <= 3


def test_max_new_tokens(endless: TorchRunner) -> None:
    generation = endless.generate(fim_prompt(), max_new_tokens=1, stop=never, cancel=CancelToken())
    assert generation.new_tokens == 1 and generation.stop_reason == "length"


def test_cancel_between_steps(endless: TorchRunner) -> None:
    token = CancelToken()
    steps: list[str] = []

    def cancel_after_two(text: str) -> int | None:
        steps.append(text)
        if len(steps) == 2:
            token.cancel("superseded")
        return None

    generation = endless.generate(
        fim_prompt(), max_new_tokens=40, stop=cancel_after_two, cancel=token
    )
    assert generation.stop_reason == "cancelled"
    assert generation.new_tokens == 2


def test_cancelled_before_start_does_no_work(runner: TorchRunner) -> None:
    token = CancelToken()
    token.cancel()
    generation = runner.generate(fim_prompt(), max_new_tokens=8, stop=never, cancel=token)
    assert generation.stop_reason == "cancelled"
    assert generation.text == ""
    assert generation.new_tokens == 0


def test_prefix_reuse_matches_a_cold_run(tiny_model_path: Path, tmp_path: Path) -> None:
    warm = TorchRunner(str(tiny_model_path), tmp_path, dtype="float32", reuse_cache=True)
    cold = TorchRunner(str(tiny_model_path), tmp_path, dtype="float32", reuse_cache=False)
    typed = [BODY_PREFIX, BODY_PREFIX + "r", BODY_PREFIX + "re", BODY_PREFIX + "res = "]
    reused = []
    for prefix in typed:
        prompt = fim_prompt(prefix)
        # Greedy texts computed two ways are equal on every CPU only away from near-ties.
        assert greedy_margin(tiny_model_path, prompt, 16) > NEAR_TIE
        to_read = warm.tokens_to_read(prompt)
        hot = warm.generate(prompt, max_new_tokens=16, stop=never, cancel=CancelToken())
        assert to_read == hot.prompt_tokens - hot.reused_tokens  # what the latency model counts
        assert cold.tokens_to_read(prompt) == hot.prompt_tokens
        ref = cold.generate(prompt, max_new_tokens=16, stop=never, cancel=CancelToken())
        assert hot.text == ref.text
        assert hot.token_logprobs == pytest.approx(ref.token_logprobs, abs=1e-4)
        assert ref.reused_tokens == 0
        reused.append(hot.reused_tokens)
    assert reused[0] == 0
    # Each keystroke re-prefills only the tokens around the cursor.
    assert all(count >= len(warm.tokenizer(BODY_PREFIX)["input_ids"]) - 2 for count in reused[1:])


def test_same_prompt_twice_reuses_all_but_one_token(
    runner: TorchRunner, tiny_model_path: Path
) -> None:
    prompt = fim_prompt(BODY_PREFIX + "x = ")
    assert greedy_margin(tiny_model_path, prompt, 4) > NEAR_TIE
    first = runner.generate(prompt, max_new_tokens=4, stop=never, cancel=CancelToken())
    second = runner.generate(prompt, max_new_tokens=4, stop=never, cancel=CancelToken())
    assert second.reused_tokens == second.prompt_tokens - 1
    assert second.text == first.text


@pytest.mark.parametrize(
    ("model", "message"),
    [
        pytest.param("/nonexistent/model.gguf", "does not exist", id="missing-gguf"),
        pytest.param("./no/such/dir", "does not exist", id="missing-path"),
    ],
)
def test_bad_model_setting(model: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=message):
        resolve_source(model, tmp_path)


def test_directory_without_config(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"without config\.json"):
        resolve_source(str(tmp_path), tmp_path)
