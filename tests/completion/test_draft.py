"""The prompt-lookup drafter: which earlier occurrence it copies from, and how much."""

from __future__ import annotations

import pytest

from completion.runners.draft import PromptLookupDrafter


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
