"""Speculative decoding in TorchRunner gives exactly what plain greedy decoding gives.

Drafts are checked with one forward pass over several tokens, whose float32 logits round slightly
differently from one-token passes; greedy texts computed both ways agree on every CPU only away
from near-ties, so each prompt's greedy path is checked to have a top-2 gap above `NEAR_TIE`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from completion.fim import template_for
from completion.runners.torch_runner import TorchRunner
from completion.types import CancelToken, Generation, StopRule
from tests.support.tiny_model import NEAR_TIE, greedy_margin

QWEN = template_for("qwen")
# The tiny model falls into repeating itself after these, so drafts copied from its own output
# are accepted, some of them only in part.
REPETITIVE = {
    "body": QWEN.build(
        "import os\n\n\ndef join_all(parts):\n    ", "\n\n\ndef main():\n    pass\n"
    ),
    "attributes": "    self.width = width\n    self.height = height\n    self.",
    "call": (
        "import textwrap\n\ndef wrap(text, width):\n    return textwrap.wrap(text, width=width)\n"
        "\ndef fill(text, width):\n    return textwrap."
    ),
}
NEW_TOKENS = 24


def never(text: str) -> int | None:
    return None


def _runner(model: Path, cache: Path, *, speculative: bool, reuse: bool = False) -> TorchRunner:
    runner = TorchRunner(
        str(model), cache, dtype="float32", reuse_cache=reuse, speculative=speculative
    )
    # No end-of-text token: only the stop rule, the token limit or cancellation end a
    # generation, so every test decodes as far as it asks whatever the model would say.
    runner._stop_ids = set()
    return runner


@pytest.fixture(scope="module")
def plain(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> TorchRunner:
    return _runner(tiny_model_path, tmp_path_factory.mktemp("cache"), speculative=False)


@pytest.fixture(scope="module")
def spec(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> TorchRunner:
    return _runner(tiny_model_path, tmp_path_factory.mktemp("cache"), speculative=True)


@pytest.fixture(scope="module")
def margins(tiny_model_path: Path) -> dict[str, float]:
    return {name: greedy_margin(tiny_model_path, p, NEW_TOKENS) for name, p in REPETITIVE.items()}


def generate(
    runner: TorchRunner,
    prompt: str,
    max_new_tokens: int = NEW_TOKENS,
    stop: StopRule = never,
    cancel: CancelToken | None = None,
) -> Generation:
    return runner.generate(
        prompt, max_new_tokens=max_new_tokens, stop=stop, cancel=cancel or CancelToken()
    )


def assert_same(reference: Generation, speculative: Generation) -> None:
    assert speculative.text == reference.text
    assert speculative.new_tokens == reference.new_tokens
    assert speculative.stop_reason == reference.stop_reason
    assert len(speculative.token_logprobs) == len(reference.token_logprobs)
    assert speculative.token_logprobs == pytest.approx(reference.token_logprobs, abs=1e-4)


@pytest.mark.parametrize("name", list(REPETITIVE))
def test_same_output_with_accepted_drafts(
    name: str, plain: TorchRunner, spec: TorchRunner, margins: dict[str, float]
) -> None:
    assert margins[name] > NEAR_TIE
    reference = generate(plain, REPETITIVE[name])
    speculative = generate(spec, REPETITIVE[name])
    assert_same(reference, speculative)
    assert reference.draft_tokens == reference.verify_steps == 0
    # Drafts were checked and accepted: the comparison is not vacuous...
    assert speculative.verify_steps > 0 and speculative.draft_accepted > 0
    # ...and fewer forward passes did the same work.
    assert speculative.decode_passes < reference.decode_passes
    assert speculative.draft_accepted <= speculative.draft_tokens


@contextmanager
def eager_drafts(runner: TorchRunner) -> Iterator[TorchRunner]:
    """The speculative runner drafting from any repeated token, four at a time: on these
    prompts the shipped drafter (3- and 4-grams) is always right, this one often wrong."""
    saved = runner.draft_ngram, runner.draft_min_ngram, runner.speculative_tokens
    runner.draft_ngram, runner.draft_min_ngram, runner.speculative_tokens = 3, 1, 4
    try:
        yield runner
    finally:
        runner.draft_ngram, runner.draft_min_ngram, runner.speculative_tokens = saved


@pytest.fixture
def eager(spec: TorchRunner) -> Iterator[TorchRunner]:
    with eager_drafts(spec) as runner:
        yield runner


@pytest.fixture(params=["shipped", "eager"])
def drafting(request: pytest.FixtureRequest, spec: TorchRunner) -> Iterator[TorchRunner]:
    """The speculative runner with the shipped drafter, and with one whose drafts often fail."""
    if request.param == "shipped":
        yield spec
    else:
        with eager_drafts(spec) as runner:
            yield runner


def test_rejected_drafts_change_nothing(
    plain: TorchRunner, eager: TorchRunner, margins: dict[str, float]
) -> None:
    # Across these prompts some drafted tokens were rejected (the model's own token replaced
    # them and the cache was cropped back), and the outputs still agree.
    rejected = 0
    for name, prompt in REPETITIVE.items():
        assert margins[name] > NEAR_TIE
        speculative = generate(eager, prompt)
        assert_same(generate(plain, prompt), speculative)
        rejected += speculative.draft_tokens - speculative.draft_accepted
    assert rejected > 0


def test_no_draft_without_repetition(plain: TorchRunner, spec: TorchRunner) -> None:
    # No token repeats in the prompt, so after the first new token no 3-gram ending in it
    # occurred before: the shipped drafter has nothing to copy, and the pass is a plain one.
    prompt = "class Point:\n    x = 1"
    ids = spec.tokenizer(prompt)["input_ids"]
    assert len(set(ids)) == len(ids)
    speculative = generate(spec, prompt, max_new_tokens=2)
    assert speculative.verify_steps == 0 and speculative.draft_tokens == 0
    assert speculative.decode_passes == 1
    assert_same(generate(plain, prompt, max_new_tokens=2), speculative)


@pytest.mark.parametrize("limit", range(1, NEW_TOKENS + 1))
def test_max_new_tokens_exact(
    limit: int, plain: TorchRunner, drafting: TorchRunner, margins: dict[str, float]
) -> None:
    assert margins["attributes"] > NEAR_TIE
    prompt = REPETITIVE["attributes"]
    speculative = generate(drafting, prompt, max_new_tokens=limit)
    assert speculative.new_tokens == limit and speculative.stop_reason == "length"
    assert_same(generate(plain, prompt, max_new_tokens=limit), speculative)


@pytest.mark.parametrize("chars", range(1, 60, 4))
def test_stop_rule_cuts_where_plain_decoding_cuts(
    chars: int, plain: TorchRunner, drafting: TorchRunner, margins: dict[str, float]
) -> None:
    assert margins["body"] > NEAR_TIE

    def after(text: str) -> int | None:
        return chars if len(text) >= chars else None

    prompt = REPETITIVE["body"]
    speculative = generate(drafting, prompt, stop=after)
    assert_same(generate(plain, prompt, stop=after), speculative)
    assert speculative.stop_reason == "stop" and len(speculative.text) == chars


@pytest.mark.parametrize("after_tokens", [1, 2, 3, 5, 8, 13])
def test_cancel_mid_way(
    after_tokens: int, plain: TorchRunner, drafting: TorchRunner, margins: dict[str, float]
) -> None:
    assert margins["call"] > NEAR_TIE

    def run(runner: TorchRunner) -> Generation:
        token = CancelToken()
        seen: list[str] = []

        def cancel_after(text: str) -> int | None:
            seen.append(text)
            if len(seen) == after_tokens:
                token.cancel("superseded")
            return None

        return generate(runner, REPETITIVE["call"], stop=cancel_after, cancel=token)

    speculative = run(drafting)
    # Cancellation is checked before every token, drafted or not: it stops where plain stops.
    assert speculative.stop_reason == "cancelled" and speculative.new_tokens == after_tokens
    assert_same(run(plain), speculative)


def test_temperature_turns_speculation_off(spec: TorchRunner) -> None:
    sampled = spec.generate(
        REPETITIVE["body"], max_new_tokens=12, stop=never, cancel=CancelToken(), temperature=0.8
    )
    assert sampled.new_tokens == 12
    assert sampled.verify_steps == sampled.draft_tokens == 0


@pytest.fixture
def warm(tiny_model_path: Path, tmp_path: Path) -> Iterator[TorchRunner]:
    yield _runner(tiny_model_path, tmp_path, speculative=True, reuse=True)


def test_prefix_cache_holds_exactly_its_tokens(
    warm: TorchRunner, plain: TorchRunner, margins: dict[str, float]
) -> None:
    prompt = REPETITIVE["body"]
    assert margins["body"] > NEAR_TIE
    first = generate(warm, prompt)
    assert first.draft_accepted > 0
    (entry,) = warm._prefix_cache._entries
    assert entry.cache.get_seq_length() == len(entry.tokens)
    prompt_ids = warm.tokenizer(prompt)["input_ids"]
    assert entry.tokens[: len(prompt_ids)] == prompt_ids
    # What follows the prompt in the cache is the generated text, in order.
    assert len(entry.tokens) - len(prompt_ids) <= first.new_tokens
    assert first.text.startswith(warm._decode(prompt_ids[-1:], entry.tokens[len(prompt_ids) :]))
    # The next request reuses it and answers exactly as a cold plain run does.
    again = generate(warm, prompt)
    assert again.reused_tokens == again.prompt_tokens - 1
    assert_same(generate(plain, prompt), again)


def test_same_answer_after_cancelled_speculative_calls(
    warm: TorchRunner, plain: TorchRunner, margins: dict[str, float]
) -> None:
    prompt = REPETITIVE["call"]
    assert margins["call"] > NEAR_TIE
    for after_tokens in (2, 5, 9):
        token = CancelToken()
        seen: list[str] = []

        def cancel_after(
            text: str, seen: list[str] = seen, n: int = after_tokens, token: CancelToken = token
        ) -> int | None:
            seen.append(text)
            if len(seen) == n:
                token.cancel()
            return None

        assert generate(warm, prompt, stop=cancel_after, cancel=token).stop_reason == "cancelled"
        for entry in warm._prefix_cache._entries:
            assert entry.cache.get_seq_length() == len(entry.tokens)
    assert_same(generate(plain, prompt), generate(warm, prompt))
