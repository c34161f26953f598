"""The drafters: which earlier occurrence the prompt-lookup one copies from, and how much; how
the rewrite one follows an output through the text it rewrites."""

from __future__ import annotations

from pathlib import Path

import pytest

from completion.runners.draft import PromptLookupDrafter, RewriteDrafter, respeller


@pytest.mark.parametrize(
    ("tokens", "count", "expected"),
    [
        pytest.param([1, 2, 3, 4, 9, 1, 2, 3], 2, [4, 9], id="copies-what-followed"),
        pytest.param([1, 2, 3, 4, 9, 1, 2, 3], 10, [4, 9, 1, 2, 3, 4, 9, 1, 2, 3], id="periodic"),
        pytest.param([1, 2, 5, 6, 1, 2, 7, 8, 1, 2], 2, [7, 8], id="most-recent-occurrence"),
        # [2 3] last occurred before 8, but [1 2 3] (longer) only before 4.
        pytest.param([1, 2, 3, 4, 2, 3, 8, 1, 2, 3], 1, [4], id="longest-tail-wins"),
        pytest.param([1, 2, 3, 4], 3, [], id="no-earlier-occurrence"),
        pytest.param([5, 6, 7, 5], 0, [], id="count-zero"),
        pytest.param([], 3, [], id="empty"),
        pytest.param([7, 7], 4, [7, 7, 7, 7], id="run-of-one-token"),
    ],
)
def test_propose(tokens: list[int], count: int, expected: list[int]) -> None:
    assert PromptLookupDrafter(tokens).propose(count) == expected


def test_appending_equals_building_at_once() -> None:
    sequence = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3]
    grown = PromptLookupDrafter(sequence[:5])
    for index in range(5, len(sequence) + 1):
        whole = PromptLookupDrafter(sequence[:index])
        assert grown.propose(4) == whole.propose(4), index
        if index < len(sequence):
            grown.append(sequence[index])


def test_min_ngram_ignores_short_matches() -> None:
    tokens = [1, 2, 9, 3, 2]  # only the 1-gram [2] occurred before
    assert PromptLookupDrafter(tokens, min_ngram=1).propose(2) == [9, 3]
    assert PromptLookupDrafter(tokens, min_ngram=2).propose(2) == []


def test_extra_tokens_are_searched_after_the_sequence() -> None:
    deleted = [10, 11, 12, 13, 14]
    drafter = PromptLookupDrafter([1, 2, 10, 11], extra=deleted)
    assert drafter.propose(3) == [12, 13, 14]
    # A match in the sequence itself beats one in the extra text.
    drafter = PromptLookupDrafter([10, 11, 99, 10, 11], extra=deleted)
    assert drafter.propose(2) == [99, 10]


@pytest.mark.parametrize(("max_ngram", "min_ngram"), [(0, 1), (2, 3), (3, 0)])
def test_bad_ngram_bounds(max_ngram: int, min_ngram: int) -> None:
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookupDrafter([1, 2], max_ngram=max_ngram, min_ngram=min_ngram)


def follow(draft: list[int], output: list[int]) -> list[int]:
    """The position in `draft` after each token of `output`."""
    drafter = RewriteDrafter(draft)
    positions = []
    for token in output:
        drafter.append(token)
        positions.append(drafter.position)
    return positions


@pytest.mark.parametrize(
    ("output", "positions"),
    [
        pytest.param([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6], id="copy"),
        # 9 is new: the draft waits where the copy stopped, and the copy resumes there.
        pytest.param([1, 2, 9, 3, 4], [1, 2, 2, 3, 4], id="insertion"),
        # 3 was dropped: 4 is found just ahead and the draft goes on after it.
        pytest.param([1, 2, 4, 5], [1, 2, 4, 5], id="deletion"),
        # 3 became 9: the draft waits at 3, then 4 re-aligns it past the changed token.
        pytest.param([1, 2, 9, 4, 5], [1, 2, 2, 4, 5], id="substitution"),
        # Two lines dropped: the longest tail [2 6] is not in the draft, [6] is, further on.
        pytest.param([1, 2, 6, 7], [1, 2, 6, 7], id="long-deletion"),
        pytest.param([1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 8], id="past-the-end"),
    ],
)
def test_rewrite_drafter_follows_the_output(output: list[int], positions: list[int]) -> None:
    assert follow([1, 2, 3, 4, 5, 6, 7, 8], output) == positions


def test_rewrite_drafter_takes_the_nearest_occurrence_of_the_longest_tail() -> None:
    # Lines "a = f(x)" repeated: after a changed token the 2-gram [5 6] names the occurrence.
    draft = [1, 5, 6, 2, 5, 7, 3, 5, 6, 4]
    drafter = RewriteDrafter(draft)
    for token in [1, 5, 9, 2, 5, 8, 5, 6]:  # the second line changed, then [5 6] as in line 3
        drafter.append(token)
    assert drafter.position == 9 and drafter.propose(3) == [4]


def test_rewrite_drafter_never_goes_back() -> None:
    # [1 2] was copied already: writing it again (a duplicated line) is new text, not a jump back.
    drafter = RewriteDrafter([1, 2, 3, 4])
    for token in [1, 2, 1, 2]:
        drafter.append(token)
    assert drafter.copied == 2 and drafter.propose(2) == [3, 4]


def test_rewrite_drafter_proposes_from_the_position() -> None:
    drafter = RewriteDrafter([1, 2, 3, 4, 5])
    assert drafter.propose(3) == [1, 2, 3]
    drafter.append(1)
    assert drafter.propose(0) == [] and drafter.propose(10) == [2, 3, 4, 5]
    assert RewriteDrafter([]).propose(4) == []
    with pytest.raises(ValueError, match="min_ngram"):
        RewriteDrafter([1], min_ngram=3, max_ngram=2)


def test_rewrite_drafter_drafts_new_text_from_the_context() -> None:
    # The window [1 2 3 4 5 6]; the latest edit (in the prompt) wrote 3 -> 8 9. The model carries
    # the change through: after 1 2 it writes 8, which the window does not hold.
    context = [50, 2, 8, 9, 4, 51, 1, 2, 3, 4, 5, 6]
    drafter = RewriteDrafter([1, 2, 3, 4, 5, 6], context=context)
    for token in [1, 2]:
        drafter.append(token)
    assert drafter.propose(3) == [3, 4, 5] and not drafter.off_window
    drafter.append(8)
    # Off the window: [2 8] followed by 9 4 51 in the prompt, where the window has no guess.
    assert drafter.off_window and drafter.propose(3) == [9, 4, 51]
    drafter.append(9)
    drafter.append(4)  # [9 4] is not in the window (only [4] is) but is in the prompt
    assert drafter.off_window and drafter.propose(2) == [51, 1]
    drafter.append(5)  # [4 5]: back on the window, after the changed token
    assert not drafter.off_window and drafter.propose(3) == [6]


def test_rewrite_drafter_drafts_past_the_window_from_the_context() -> None:
    # The model goes on past the window's end, writing a line the prompt holds.
    drafter = RewriteDrafter([1, 2, 3], context=[7, 2, 3, 10, 11, 12, 7])
    for token in [1, 2, 3]:
        drafter.append(token)
    assert drafter.propose(2) == [10, 11]
    # Without a context, the window's end is where drafts stop.
    alone = RewriteDrafter([1, 2, 3])
    for token in [1, 2, 3]:
        alone.append(token)
    assert alone.propose(2) == []
    # A tail the context does not hold leaves the window's draft.
    lost = RewriteDrafter([1, 2, 3, 4], context=[20, 21])
    for token in [1, 9]:
        lost.append(token)
    assert lost.off_window and lost.propose(2) == [2, 3]


def test_rewrite_drafter_follows_text_written_in_shorter_tokens() -> None:
    # Token 1 spells "\n\n", token 2 "\n": the model writes the window's blank line as 2 2.
    texts = {1: "\n\n", 2: "\n", 3: "def", 4: " f", 5: "x"}

    def respell(expected: int, token: int) -> list[int] | None:
        whole, part = texts[expected], texts[token]
        if len(part) < len(whole) and whole.startswith(part):
            return [t for t, text in texts.items() if text == whole[len(part) :]]
        return None

    drafter = RewriteDrafter([1, 3, 4], respell=respell)
    drafter.append(2)
    assert not drafter.off_window and drafter.propose(3) == [2, 3, 4]
    for token in [2, 3]:
        drafter.append(token)
    assert drafter.propose(2) == [4]
    # An insertion that began like the expected token and goes on otherwise: the draft is back at
    # that token, and the window as it was.
    inserted = RewriteDrafter([1, 3, 4], respell=respell)
    for token in [2, 5]:
        inserted.append(token)
    assert inserted.draft == [1, 3, 4] and inserted.propose(3) == [1, 3, 4]
    # A token whose text does not start the expected one's is a mismatch as before.
    other = RewriteDrafter([1, 3, 4], respell=respell)
    other.append(5)
    assert other.off_window and other.propose(2) == [1, 3]


def test_respeller_spells_the_rest_of_a_token_with_a_real_tokenizer(tiny_model_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path))
    options = {"skip_special_tokens": False, "clean_up_tokenization_spaces": False}
    respell = respeller(
        lambda ids: str(tokenizer.decode(ids, **options)),
        lambda text: list(tokenizer.encode(text, add_special_tokens=False)),
    )
    (blank_line,) = tokenizer.encode("\n\n", add_special_tokens=False)
    (newline,) = tokenizer.encode("\n", add_special_tokens=False)
    assert respell(blank_line, newline) == [newline]
    assert respell(newline, blank_line) is None  # longer, not a start
    assert respell(newline, newline) is None
    (indent,) = tokenizer.encode("    ", add_special_tokens=False)
    assert respell(blank_line, indent) is None
