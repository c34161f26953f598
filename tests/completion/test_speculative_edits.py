"""Speculative edits (`DraftRunner.generate_with_draft`) give exactly what plain greedy decoding
gives, on the torch runner and on the ONNX Runtime GenAI runner, whatever the draft.

The tiny model does not write good rewrites, so the drafts here are made from its own greedy
output, changed the ways a real edit changes a window (text inserted, deleted, replaced): the
drafter must re-align after each change for its drafts to be accepted again. (The tiny model's
output soon repeats itself, which makes re-aligning easy; `test_draft.py` holds the drafter to
where it re-aligns on text that does not repeat.) The prompt's greedy path has a top-2 gap above
`NEAR_TIE`, so the one-token and many-token passes, which round differently, choose the same
tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import pairwise
from pathlib import Path

import pytest

from completion.runners.base import DraftRunner, ModelRunner, RunnerCapabilities
from completion.runners.draft import RewriteDrafter
from completion.runners.onnx import OnnxRunner
from completion.runners.prefix_cache import common_prefix_length
from completion.runners.torch_runner import MIN_EDIT_DRAFT_TOKENS, TorchRunner
from completion.types import CancelToken, Generation, StopRule
from tests.support.tiny_model import NEAR_TIE, greedy_margin

WINDOW = (
    "def wrap(text, width):\n"
    "    lines = text.splitlines()\n"
    "    return [line[:width] for line in lines]\n"
)
PROMPT = f"<|file_sep|>current/wrap.py\n{WINDOW}<|file_sep|>updated/wrap.py\n{WINDOW[:40]}"
NEW_TOKENS = 40


def never(_text: str) -> int | None:
    return None


class Runner:
    """A runner that offers drafted decoding, named for the test ids."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner = runner
        drafts = RunnerCapabilities.of(runner).drafts
        assert drafts is not None
        self.drafts: DraftRunner = drafts
        # How far a drafted token's log-probability may be from the plain pass's. ONNX Runtime's
        # int8 kernels for one token and for several round differently, and by how much depends
        # on the CPU's instructions (1.4e-3 on one with AVX-512 VNNI, under 1e-3 on AVX2 alone);
        # a drafted logit read from the wrong position would be off by far more.
        self.logprob_tolerance = 1e-2 if isinstance(runner, OnnxRunner) else 1e-3

    def plain(self, max_new_tokens: int = NEW_TOKENS, stop: StopRule = never) -> Generation:
        return self.runner.generate(
            PROMPT, max_new_tokens=max_new_tokens, stop=stop, cancel=CancelToken()
        )

    def drafted(
        self,
        draft: str,
        max_new_tokens: int = NEW_TOKENS,
        stop: StopRule = never,
        cancel: CancelToken | None = None,
    ) -> Generation:
        return self.drafts.generate_with_draft(
            PROMPT,
            draft=draft,
            max_new_tokens=max_new_tokens,
            stop=stop,
            cancel=cancel or CancelToken(),
        )


@pytest.fixture(scope="module")
def margin(tiny_model_path: Path) -> float:
    return greedy_margin(tiny_model_path, PROMPT, NEW_TOKENS)


def _torch(model: Path, cache: Path) -> ModelRunner:
    runner = TorchRunner(str(model), cache, dtype="float32", reuse_cache=False)
    # No end-of-text token: every generation runs as far as it is asked.
    runner._stop_ids = set()
    return runner


def _onnx(model: Path, cache: Path) -> ModelRunner:
    runner = OnnxRunner(str(model), cache, threads=1, precision="int8")
    runner.stop_ids = frozenset()
    return runner


@pytest.fixture(scope="module", params=[_torch, _onnx], ids=["torch", "onnx"])
def runner(
    request: pytest.FixtureRequest,
    tiny_model_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Runner]:
    build: Callable[[Path, Path], ModelRunner] = request.param
    loaded = build(tiny_model_path, tmp_path_factory.mktemp("cache"))
    yield Runner(loaded)
    loaded.close()


@pytest.fixture(scope="module")
def reference(runner: Runner, margin: float) -> Generation:
    assert margin > NEAR_TIE
    generation = runner.plain()
    assert generation.new_tokens == NEW_TOKENS and generation.decode_passes == NEW_TOKENS - 1
    return generation


def assert_same(runner: Runner, reference: Generation, drafted: Generation) -> None:
    assert drafted.text == reference.text
    assert drafted.new_tokens == reference.new_tokens
    assert drafted.stop_reason == reference.stop_reason
    tolerance = runner.logprob_tolerance
    assert drafted.token_logprobs == pytest.approx(reference.token_logprobs, abs=tolerance)
    assert drafted.draft_accepted <= drafted.draft_tokens


def edited(text: str, how: str) -> tuple[str, int]:
    """`text` changed as an edit changes it, and where the change starts."""
    at = len(text) // 3
    changed = {
        "copy": text,
        "insertion": text[:at] + "count = 0\n" + text[at:],
        "deletion": text[:at] + text[at + 12 :],
        "substitution": text[:at] + "#" * 6 + text[at + 6 :],
    }[how]
    return changed, at


@pytest.mark.parametrize("how", ["copy", "insertion", "deletion", "substitution"])
def test_edited_drafts_give_the_plain_output(
    how: str, runner: Runner, reference: Generation
) -> None:
    draft, at = edited(reference.text, how)
    drafted = runner.drafted(draft)
    assert_same(runner, reference, drafted)
    # The draft served after the change too: more of it was accepted than the text before the
    # change holds (a drafter that lost its place would accept at most that)...
    before = runner.runner.count_tokens(reference.text[:at])
    assert drafted.draft_accepted > before + 3
    # ...and fewer forward passes did the same work.
    assert drafted.decode_passes < reference.decode_passes // 2


@pytest.mark.parametrize("draft", ["", "import os\nimport sys\n" * 4], ids=["empty", "unrelated"])
def test_useless_drafts_give_the_plain_output(
    draft: str, runner: Runner, reference: Generation
) -> None:
    drafted = runner.drafted(draft)
    assert_same(runner, reference, drafted)
    # The window has nothing to offer, so the drafts came from the prompt and the output so far
    # (`RewriteDrafter`'s context): the tiny model's output repeats itself, and they served.
    assert drafted.draft_accepted > NEW_TOKENS // 2


@pytest.mark.parametrize("limit", [1, 2, 7, 16, 17, 33])
def test_max_new_tokens_exact(limit: int, runner: Runner, reference: Generation) -> None:
    drafted = runner.drafted(reference.text, max_new_tokens=limit)
    assert drafted.new_tokens == limit and drafted.stop_reason == "length"
    assert_same(runner, runner.plain(max_new_tokens=limit), drafted)


@pytest.mark.parametrize("chars", [1, 9, 30, 61])
def test_stop_rule_cuts_where_plain_decoding_cuts(
    chars: int, runner: Runner, reference: Generation
) -> None:
    def after(text: str) -> int | None:
        return chars if len(text) >= chars else None

    drafted = runner.drafted(reference.text, stop=after)
    assert drafted.stop_reason == "stop" and len(drafted.text) == chars
    assert_same(runner, runner.plain(stop=after), drafted)


@pytest.mark.parametrize("after_tokens", [1, 5, 18])
def test_cancel_stops_where_plain_decoding_would(
    after_tokens: int, runner: Runner, reference: Generation
) -> None:
    token = CancelToken()
    seen: list[str] = []

    def cancel_after(text: str) -> int | None:
        seen.append(text)
        if len(seen) == after_tokens:
            token.cancel("superseded")
        return None

    drafted = runner.drafted(reference.text, stop=cancel_after, cancel=token)
    # Cancellation is checked before every token, drafted or not.
    assert drafted.stop_reason == "cancelled" and drafted.new_tokens == after_tokens
    assert drafted.text == runner.plain(max_new_tokens=after_tokens).text


def test_the_next_plain_request_is_unchanged(runner: Runner, reference: Generation) -> None:
    # The ONNX runner keeps its prompt state across requests; drafted calls leave it usable.
    runner.drafted(edited(reference.text, "deletion")[0])
    assert_same(runner, reference, runner.plain())


def test_draft_lengths_follow_what_the_model_took(
    tiny_model_path: Path,
    tmp_path: Path,
    margin: float,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The torch runner checks the first draft in the prompt's last pass; after a mismatch the next
    # draft is twice the agreed part of the last one (at least MIN_EDIT_DRAFT_TOKENS), and after a
    # draft taken whole the longest again.
    assert margin > NEAR_TIE
    loaded = _torch(tiny_model_path, tmp_path)
    assert isinstance(loaded, TorchRunner)
    loaded.edit_draft_tokens = 32
    runner = Runner(loaded)
    reference = runner.plain()
    proposals: list[tuple[int, int, list[int]]] = []  # (output so far, count asked, draft)
    propose = RewriteDrafter.propose

    def recorded(self: RewriteDrafter, count: int) -> list[int]:
        draft = propose(self, count)
        proposals.append((len(self.output), count, draft))
        return draft

    monkeypatch.setattr(RewriteDrafter, "propose", recorded)
    draft, _ = edited(reference.text, "substitution")
    drafted = runner.drafted(draft)
    assert_same(runner, reference, drafted)
    output = loaded.tokenizer(reference.text, add_special_tokens=False)["input_ids"]
    assert len(output) == NEW_TOKENS
    # The first draft was read with the prompt: every later one had a pass of its own.
    assert proposals[0][:2] == (0, 32)
    assert drafted.decode_passes == len(proposals) - 1
    assert drafted.verify_steps == sum(1 for _, _, tokens in proposals if tokens)
    mismatches = 0
    for (start, _, tokens), (after, count, _) in pairwise(proposals):
        agreed = common_prefix_length(tokens, output[start:])
        whole = agreed == len(tokens)
        mismatches += not whole
        expected = 32 if whole else min(32, max(MIN_EDIT_DRAFT_TOKENS, 2 * agreed))
        assert count == min(expected, NEW_TOKENS - after)
    assert mismatches >= 1  # the substitution broke at least one draft
