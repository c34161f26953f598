"""The common start and end of two sequences, checked against one step per item."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from common.sequences import common_end, common_start


def naive_start(a: str, b: str) -> int:
    length = 0
    while length < min(len(a), len(b)) and a[length] == b[length]:
        length += 1
    return length


def naive_end(a: str, b: str, start: int) -> int:
    length = 0
    while length < min(len(a), len(b)) - start and a[-1 - length] == b[-1 - length]:
        length += 1
    return length


TEXT = st.text(alphabet="ab\n", max_size=80)


@given(shared=TEXT, a=TEXT, b=TEXT, tail=TEXT)
def test_start_and_end_equal_one_step_per_item(shared: str, a: str, b: str, tail: str) -> None:
    first, second = shared + a + tail, shared + b + tail
    start = common_start(first, second)
    assert start == naive_start(first, second)
    assert common_end(first, second, start) == naive_end(first, second, start)
    assert common_end(first, second) == naive_end(first, second, 0)
    # Lists (of lines) and bytes the same way.
    assert common_start(list(first), list(second)) == start
    assert common_start(first.encode(), second.encode()) == start


def test_the_same_text_is_shared_whole() -> None:
    text = "x" * 1000 + "y"
    assert common_start(text, text) == len(text)
    assert common_end(text, text, len(text)) == 0
    assert common_end(text, text) == len(text)
    assert common_start("", text) == common_end(text, "") == 0
