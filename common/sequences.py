"""How much two sequences (strings, bytes, lists) share at their start and at their end.

The blocks compared are slices, compared at C speed: a block doubles while it matches, then
halves towards the first difference, so the cost grows with the length shared, in a few dozen
Python steps, not with one step per item.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def common_start(a: Sequence[Any], b: Sequence[Any]) -> int:
    """The length of the longest common start of `a` and `b`."""

    def same(length: int, block: int) -> bool:
        return a[length : length + block] == b[length : length + block]

    return _longest(min(len(a), len(b)), same)


def common_end(a: Sequence[Any], b: Sequence[Any], start: int = 0) -> int:
    """The length of the longest common end of `a` and `b` that leaves their first `start` items
    alone (pass `common_start(a, b)` for the two not to overlap)."""
    end_a, end_b = len(a), len(b)

    def same(length: int, block: int) -> bool:
        return (
            a[end_a - length - block : end_a - length] == b[end_b - length - block : end_b - length]
        )

    return _longest(min(end_a, end_b) - start, same)


def _longest(limit: int, same: Callable[[int, int], bool]) -> int:
    """The greatest length up to `limit` shared, where `same(length, block)` says whether the
    `block` items after the first `length` are shared."""
    length, block = 0, 1
    while length + block <= limit and same(length, block):
        length += block
        block *= 2
    # The first difference (or the limit) lies in the next `block` items.
    while block > 1:
        block //= 2
        if length + block <= limit and same(length, block):
            length += block
    return length
