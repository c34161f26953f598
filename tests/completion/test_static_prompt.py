"""The fast engine's prompt reuse across keystrokes (`completion/runners/static_prompt.py`).

The split rule and the keep/reset decisions are checked as plain logic; the runner is checked on
the committed tiny model against itself (what it writes differs between CPUs): a request gives
the same text whatever came before it, typing on one line is served from the kept state, and the
engine never keeps more than one state.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from completion.runners.ct2 import Ct2Runner
from completion.runners.static_prompt import GRID, MARGIN, MIN_TOKENS, StaticPrompt
from completion.types import CancelToken

MARKER = 7
BREAK = 1  # the token that holds a line break in these token lists


def tokens(lines: int, width: int = 10) -> list[int]:
    """`lines` lines of `width - 1` word tokens and a line break each."""
    return [BREAK if (i + 1) % width == 0 else 100 + i for i in range(lines * width)]


def prompt_ids(before: list[int], typed: int) -> list[int]:
    return [*before, *range(200, 200 + typed), MARKER, 300, 301, 8]


def test_the_static_part_ends_at_a_line_break_a_margin_before_the_cursor() -> None:
    reuse = StaticPrompt(MARKER, lambda token: token == BREAK)
    ids = prompt_ids(tokens(30), typed=4)
    end = reuse.split(ids)
    cursor = ids.index(MARKER)
    assert MIN_TOKENS <= end <= cursor - MARGIN
    assert ids[end] == BREAK  # the break starts the part read each time
    grid_point = (cursor - MARGIN) // GRID * GRID
    assert end == max(i for i in range(grid_point + 1) if ids[i] == BREAK)


def test_typing_on_keeps_the_static_part_until_the_grid_moves() -> None:
    reuse = StaticPrompt(MARKER, lambda token: token == BREAK)
    before = tokens(30)
    ends = [reuse.split(prompt_ids(before, typed)) for typed in range(GRID + MARGIN)]
    assert ends[0] > 0
    assert len(set(ends)) == 2  # one move, by one grid step, in GRID keystrokes
    first_change = next(i for i, end in enumerate(ends) if end != ends[0])
    assert all(end == ends[0] for end in ends[:first_change])
    assert all(end == ends[first_change] for end in ends[first_change:])


def test_prompts_without_the_marker_or_too_short_are_read_whole() -> None:
    reuse = StaticPrompt(MARKER, lambda token: token == BREAK)
    assert reuse.split(tokens(30)) == 0  # no suffix marker
    assert reuse.split(prompt_ids(tokens(5), typed=2)) == 0  # under MIN_TOKENS before the cursor
    assert StaticPrompt(None, lambda token: True).split(prompt_ids(tokens(30), 2)) == 0
    no_breaks = StaticPrompt(MARKER, lambda token: False)
    assert no_breaks.split(prompt_ids(tokens(30), typed=2)) == 0


def test_a_part_is_kept_from_its_second_use_and_only_one_at_a_time() -> None:
    reuse = StaticPrompt(MARKER, lambda token: token == BREAK)
    a, b = (1, 2, 3), (4, 5, 6)
    assert reuse.decide(a) == "once"  # a one-off request keeps nothing
    assert reuse.decide(a) == "keep"
    reuse.kept_now(a, reset=False)
    assert reuse.decide(a) == "hit"
    assert reuse.decide(b) == "once"  # elsewhere once: the kept part stays
    assert reuse.decide(a) == "hit"
    assert reuse.decide(b) == "once"
    assert reuse.decide(b) == "reset"  # typing there now: empty the cache, keep the new part
    reuse.kept_now(b, reset=True)
    assert (reuse.kept, reuse.hits, reuse.resets) == (b, 2, 1)
    reuse.forget()
    assert reuse.decide(b) == "keep"


SOURCE = "def running_totals(values):\n    total_0 = values[0]\n" + "".join(
    f"    total_{i} = combine(total_{i - 1}, values[{i}])\n" for i in range(1, 40)
)
LINE = "    result = combine(total_39, values[40])"


def typed_prompt(chars: int) -> str:
    return f"<|fim_prefix|>{SOURCE}{LINE[:chars]}<|fim_suffix|>\n    return result\n<|fim_middle|>"


def never(_text: str) -> int | None:
    return None


@pytest.fixture(scope="module")
def runner(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ct2Runner]:
    loaded = Ct2Runner(str(tiny_model_path), tmp_path_factory.mktemp("ct2-reuse"), threads=1)
    yield loaded
    loaded.close()


def complete(runner: Ct2Runner, prompt: str) -> tuple[str, list[float], int]:
    result = runner.generate(prompt, max_new_tokens=8, stop=never, cancel=CancelToken())
    return result.text, result.token_logprobs, result.reused_tokens


def test_typing_on_a_line_reads_only_its_end_and_writes_what_a_cold_request_writes(
    runner: Ct2Runner, tiny_model_path: Path, tmp_path: Path
) -> None:
    assert runner.reuse is not None
    prompts = [typed_prompt(chars) for chars in range(8, len(LINE), 4)]
    typed = []
    for prompt in prompts:
        to_read = runner.tokens_to_read(prompt)  # what the latency prediction counts
        typed.append(complete(runner, prompt))
        assert to_read == runner.count_tokens(prompt) - typed[-1][2]
    assert sum(reused > 0 for _, _, reused in typed) >= len(prompts) - 2
    assert runner.tokens_to_read(prompts[-1]) < runner.count_tokens(prompts[-1]) - MIN_TOKENS
    assert runner.kept_tokens > MIN_TOKENS
    # Each request again, on a runner that has seen nothing else: the same text.
    for prompt, (text, logprobs, _) in zip(prompts, typed, strict=True):
        cold = Ct2Runner(str(tiny_model_path), runner.cache_dir, threads=1)
        try:
            assert complete(cold, prompt)[:2] == (text, logprobs)
        finally:
            cold.close()
    # And in reverse order on the typing runner, its kept state in use.
    for prompt, (text, logprobs, _) in reversed(list(zip(prompts, typed, strict=True))):
        assert complete(runner, prompt)[:2] == (text, logprobs)


def test_moving_elsewhere_keeps_one_state_at_a_time(runner: Ct2Runner) -> None:
    assert runner.reuse is not None
    here = typed_prompt(12)
    complete(runner, here)
    complete(runner, here)
    kept_here = runner.reuse.kept
    resets = runner.reuse.resets
    elsewhere = here.replace("def running_totals", "def other_totals")
    reference = complete(runner, elsewhere)
    assert runner.reuse.kept == kept_here  # a one-off request elsewhere keeps nothing
    assert complete(runner, elsewhere)[:2] == reference[:2]
    assert runner.reuse.resets == resets + 1  # the engine's cache emptied, then the new part
    assert runner.reuse.kept != kept_here
    assert runner.generator.model_is_loaded
    assert complete(runner, elsewhere)[2] > 0


class FailingReload:
    """The engine's generator, except that loading the model again fails (files changed)."""

    def __init__(self, generator: object) -> None:
        self._generator = generator

    def load_model(self) -> None:
        raise RuntimeError("Unable to open file 'model.bin'")

    def __getattr__(self, name: str) -> object:
        return getattr(self._generator, name)


def test_a_failed_reload_loads_the_model_afresh_and_serving_goes_on(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    runner = Ct2Runner(str(tiny_model_path), tmp_path, threads=1)
    try:
        here = typed_prompt(12)
        reference = complete(runner, here)
        complete(runner, here)  # kept
        runner.generator = FailingReload(runner.generator)
        elsewhere = here.replace("def running_totals", "def other_totals")
        complete(runner, elsewhere)
        complete(runner, elsewhere)  # a reset: the reload fails, a new generator takes over
        assert not isinstance(runner.generator, FailingReload)
        assert runner.reuse is not None and runner.reuse.resets == 1
        assert complete(runner, here)[:2] == reference[:2]
    finally:
        runner.close()


def test_one_request_is_one_use_whatever_it_reads_again(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    """The candidates' second batch and a healing reread read the prompt again within the same
    request: that is not the user typing there, so it keeps nothing and empties nothing."""
    runner = Ct2Runner(str(tiny_model_path), tmp_path, threads=1)
    try:
        assert runner.reuse is not None
        here = typed_prompt(12)
        complete(runner, here)
        complete(runner, here)
        kept_here = runner.reuse.kept
        elsewhere = here.replace("def running_totals", "def other_totals")
        found = runner.generate_candidates(
            elsewhere, count=3, max_new_tokens=6, stop=never, cancel=CancelToken()
        )
        assert len(found) >= 2  # the alternatives' batch ran
        assert (runner.reuse.kept, runner.reuse.resets) == (kept_here, 0)
        cancelled = CancelToken()
        cancelled.cancel()
        runner.generate(elsewhere, max_new_tokens=6, stop=never, cancel=cancelled)
        assert (runner.reuse.kept, runner.reuse.resets) == (kept_here, 0)  # decided nothing
    finally:
        runner.close()
