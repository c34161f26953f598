"""A long prefill stops at the next chunk when cancelled, and keeps what it computed."""

from __future__ import annotations

from pathlib import Path

import pytest

from completion.runners.torch_runner import PREFILL_CHUNK_TOKENS, TorchRunner
from completion.types import CancelToken
from tests.support.tiny_model import NEAR_TIE, greedy_margin

PROMPT = "".join(f"def function_{i}(value):\n    return value + {i}\n\n" for i in range(40))


class CancelAfterChecks(CancelToken):
    """Reads as cancelled from the n-th check on, as if a keystroke came mid-prefill."""

    def __init__(self, checks: int) -> None:
        super().__init__()
        self.checks = checks

    @property
    def cancelled(self) -> bool:
        self.checks -= 1
        return self.checks < 0


@pytest.fixture(scope="module")
def runner(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> TorchRunner:
    return TorchRunner(str(tiny_model_path), tmp_path_factory.mktemp("cache"))


def test_cancelled_prefill_stops_after_one_chunk_and_is_reused(runner: TorchRunner) -> None:
    total = runner.count_tokens(PROMPT)
    assert total > 3 * PREFILL_CHUNK_TOKENS
    # Check 1 (before any work) passes; check 2 (after the first chunk) cancels.
    first = runner.generate(
        PROMPT, max_new_tokens=8, stop=lambda text: None, cancel=CancelAfterChecks(1)
    )
    assert first.stop_reason == "cancelled"
    assert first.text == "" and first.new_tokens == 0
    # The next request for the same prompt starts from the chunk already computed.
    second = runner.generate(PROMPT, max_new_tokens=8, stop=lambda text: None, cancel=CancelToken())
    assert second.reused_tokens == PREFILL_CHUNK_TOKENS
    assert second.stop_reason != "cancelled"


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
