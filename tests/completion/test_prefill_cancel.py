"""A long prefill stops at the next decoder layer when cancelled, and keeps the chunks it read."""

from __future__ import annotations

from pathlib import Path

import pytest

from completion.runners.torch_runner import PREFILL_CHUNK_TOKENS, TorchRunner, _decoder_layers
from completion.types import Cancelled, CancelToken
from tests.support.tiny_model import NEAR_TIE, greedy_margin

PROMPT = "".join(f"def function_{i}(value):\n    return value + {i}\n\n" for i in range(40))


class CancelAfterChecks(CancelToken):
    """Reads as cancelled from the check after the first `checks` on, as if a keystroke came
    mid-prefill; `reads` counts the checks made."""

    def __init__(self, checks: int) -> None:
        super().__init__()
        self.checks = checks
        self.reads = 0

    @property
    def cancelled(self) -> bool:
        self.reads += 1
        return self.reads > self.checks


@pytest.fixture(scope="module")
def runner(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> TorchRunner:
    return TorchRunner(str(tiny_model_path), tmp_path_factory.mktemp("cache"))


def test_cancelled_prefill_stops_after_one_chunk_and_is_reused(runner: TorchRunner) -> None:
    total = runner.count_tokens(PROMPT)
    assert total > 3 * PREFILL_CHUNK_TOKENS
    layers = len(_decoder_layers(runner.model))
    assert layers > 1
    # Check 1 (before any work) and one per layer of the first chunk pass; the check after the
    # first chunk cancels.
    first = runner.generate(
        PROMPT, max_new_tokens=8, stop=lambda text: None, cancel=CancelAfterChecks(1 + layers)
    )
    assert first.stop_reason == "cancelled"
    assert first.text == "" and first.new_tokens == 0
    # The next request for the same prompt starts from the chunk already computed.
    second = runner.generate(PROMPT, max_new_tokens=8, stop=lambda text: None, cancel=CancelToken())
    assert second.reused_tokens == PREFILL_CHUNK_TOKENS
    assert second.stop_reason != "cancelled"


def test_a_cancel_inside_a_pass_stops_at_the_next_layer_and_keeps_the_chunks_before(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    runner = TorchRunner(str(tiny_model_path), tmp_path)
    layers = len(_decoder_layers(runner.model))
    # The first chunk's pass and the check after it pass; the second chunk's pass is cancelled
    # before its second layer, when its first layer has written keys and values.
    cancel = CancelAfterChecks(1 + layers + 1 + 1)
    first = runner.generate(PROMPT, max_new_tokens=8, stop=lambda text: None, cancel=cancel)
    assert first.stop_reason == "cancelled" and not first.prefill_done
    assert cancel.reads == cancel.checks + 1  # nothing ran after the check that said so
    # The half-written pass is gone from the cache: the next request reads on from the first
    # chunk and writes what a runner that was never cancelled writes.
    assert greedy_margin(tiny_model_path, PROMPT, 12) > NEAR_TIE
    resumed = runner.generate(
        PROMPT, max_new_tokens=12, stop=lambda text: None, cancel=CancelToken()
    )
    assert resumed.reused_tokens == PREFILL_CHUNK_TOKENS
    fresh = TorchRunner(str(tiny_model_path), tmp_path, reuse_cache=False)
    reference = fresh.generate(
        PROMPT, max_new_tokens=12, stop=lambda text: None, cancel=CancelToken()
    )
    assert resumed.text == reference.text and resumed.new_tokens == reference.new_tokens


def test_chunked_prefill_gives_the_same_text_as_one_pass(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    # Chunked and whole prefills round differently; the texts agree on every CPU away from ties.
    assert greedy_margin(tiny_model_path, PROMPT, 12) > NEAR_TIE
    chunked = TorchRunner(str(tiny_model_path), tmp_path, reuse_cache=False)
    text = chunked.generate(
        PROMPT, max_new_tokens=12, stop=lambda text: None, cancel=CancelToken()
    ).text
    one_pass = TorchRunner(str(tiny_model_path), tmp_path, reuse_cache=False)
    one_pass.prefill_chunk_tokens = 100_000
    reference = one_pass.generate(
        PROMPT, max_new_tokens=12, stop=lambda text: None, cancel=CancelToken()
    ).text
    assert text == reference


# A prompt's start, as a next-edit prompt's recent edits: it ends before a special token, so
# its tokens are the first tokens of the whole prompt.
START = "".join(f"<|file_sep|>a.py.diff\noriginal:\nx = {i}\nupdated:\ny = {i}\n" for i in range(3))
REST = "<|file_sep|>current/a.py\n" + PROMPT[:400]


def test_a_read_prefix_is_the_start_the_prompt_reads_no_more(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    runner = TorchRunner(str(tiny_model_path), tmp_path)
    start_tokens = runner.count_tokens(START)
    assert runner.count_tokens(START + REST) == start_tokens + runner.count_tokens(REST)
    assert runner.read_prefix(START, CancelToken()) == start_tokens
    assert runner.tokens_to_read(START + REST) == runner.count_tokens(REST)
    assert runner.read_prefix(START, CancelToken()) == 0  # kept: nothing to compute
    assert greedy_margin(tiny_model_path, START + REST, 12) > NEAR_TIE
    read = runner.generate(
        START + REST, max_new_tokens=12, stop=lambda t: None, cancel=CancelToken()
    )
    assert read.reused_tokens == start_tokens
    fresh = TorchRunner(str(tiny_model_path), tmp_path, reuse_cache=False)
    reference = fresh.generate(
        START + REST, max_new_tokens=12, stop=lambda t: None, cancel=CancelToken()
    )
    assert read.text == reference.text and read.new_tokens == reference.new_tokens


def test_a_stopped_read_raises_and_keeps_the_passes_it_finished(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    runner = TorchRunner(str(tiny_model_path), tmp_path)
    layers = len(_decoder_layers(runner.model))
    # The first chunk's pass finishes; the second is stopped before its second layer.
    cancel = CancelAfterChecks(layers + 1)
    cancel.reason = "an inline request"
    with pytest.raises(Cancelled, match="an inline request"):
        runner.read_prefix(PROMPT, cancel)
    assert runner.tokens_to_read(PROMPT) == runner.count_tokens(PROMPT) - PREFILL_CHUNK_TOKENS
    # A read again computes only the rest.
    assert runner.read_prefix(PROMPT, CancelToken()) == (
        runner.count_tokens(PROMPT) - PREFILL_CHUNK_TOKENS
    )


def test_a_read_in_short_passes_keeps_those_before_the_stop(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    runner = TorchRunner(str(tiny_model_path), tmp_path)
    layers = len(_decoder_layers(runner.model))
    # Two passes of 16 tokens finish; the third is stopped before its first layer.
    with pytest.raises(Cancelled):
        runner.read_prefix(PROMPT, CancelAfterChecks(2 * layers), pass_tokens=16)
    assert runner.tokens_to_read(PROMPT) == runner.count_tokens(PROMPT) - 32
