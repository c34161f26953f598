"""The edit history: merging nearby edits, splitting at pauses and jumps, bounds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from completion.next_edit.history import MAX_EVENT_CHARS, EditHistory
from completion.next_edit.text import document_lines

SOURCE = "".join(f"line {n}\n" for n in range(40))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Buffer:
    """A document that applies edits and records them in a history, as the server does."""

    def __init__(self, history: EditHistory, text: str = SOURCE, path: str = "a.py") -> None:
        self.history, self.text, self.path = history, text, path

    def edit(self, line: int, character: int, removed: str, inserted: str) -> bool:
        lines = list(document_lines(self.text))
        offset = sum(map(len, lines[:line])) + character
        assert self.text[offset : offset + len(removed)] == removed
        self.text = self.text[:offset] + inserted + self.text[offset + len(removed) :]
        return self.history.record_edit(
            self.path, document_lines(self.text), line, character, removed, inserted
        )


def test_typing_in_one_place_is_one_event_with_context() -> None:
    clock = Clock()
    history = EditHistory(clock=clock)
    buffer = Buffer(history)
    for index, char in enumerate("abc"):
        clock.now += 0.2
        assert buffer.edit(5, 6 + index, "", char)
    (event,) = history.events()
    assert event.edits == 3
    assert event.original == ("line 3\n", "line 4\n", "line 5\n", "line 6\n", "line 7\n")
    assert event.updated == ("line 3\n", "line 4\n", "line 5abc\n", "line 6\n", "line 7\n")
    assert event.start == 3


def test_a_pause_splits_events() -> None:
    clock = Clock()
    history = EditHistory(clock=clock)
    buffer = Buffer(history)
    buffer.edit(5, 0, "", "x")
    clock.now += 1.5
    buffer.edit(5, 1, "", "y")
    assert [e.edits for e in history.events()] == [1, 1]
    assert history.events()[1].original_text.count("xline 5") == 1


def test_an_edit_far_away_starts_a_new_event_and_moves_those_below() -> None:
    clock = Clock()
    history = EditHistory(clock=clock)
    buffer = Buffer(history)
    buffer.edit(30, 0, "", "z")
    buffer.edit(2, 0, "line 2\n", "")  # a line deleted above the first event
    first, second = history.events()
    assert first.start == 27  # it was 28 (two lines of context above line 30)
    assert first.updated[2] == "zline 30\n"
    lines = document_lines(buffer.text)
    assert tuple(lines[first.start : first.end]) == first.updated
    # The deletion ends at line 3's start, so line 3 is part of the edit; two lines of context.
    assert second.original_text == "".join(f"line {n}\n" for n in range(6))
    assert second.updated_text == "".join(f"line {n}\n" for n in (0, 1, 3, 4, 5))


def test_edits_within_eight_lines_merge_with_the_lines_between() -> None:
    clock = Clock()
    history = EditHistory(clock=clock)
    buffer = Buffer(history)
    buffer.edit(10, 0, "line", "row")
    clock.now += 0.5
    buffer.edit(16, 0, "line", "row")
    (event,) = history.events()
    lines = document_lines(buffer.text)
    assert tuple(lines[event.start : event.end]) == event.updated
    assert event.original_text == "".join(f"line {n}\n" for n in range(8, 19))
    assert event.updated_text.count("row") == 2


def test_an_edit_above_a_merged_region_keeps_the_original_right() -> None:
    clock = Clock()
    history = EditHistory(clock=clock)
    buffer = Buffer(history)
    buffer.edit(10, 0, "", "a\nb\n")  # two lines inserted
    clock.now += 0.1
    buffer.edit(7, 0, "line 7\n", "")  # one removed above it, within reach
    (event,) = history.events()
    lines = document_lines(buffer.text)
    assert tuple(lines[event.start : event.end]) == event.updated
    assert event.original_text == "".join(f"line {n}\n" for n in range(5, 13))


def test_only_the_last_six_events_are_kept() -> None:
    clock = Clock()
    history = EditHistory(clock=clock)
    buffer = Buffer(history)
    for n in range(9):
        clock.now += 2
        buffer.edit(n * 4, 0, "", "#")
    assert len(history) == 6
    assert history.events()[0].updated_text.count("#line 12") == 1


def test_big_edits_are_kept_cut_and_never_merged_into() -> None:
    clock = Clock()
    history = EditHistory(clock=clock)
    buffer = Buffer(history)
    buffer.edit(3, 0, "", "x" * 10_000 + "\n")
    (event,) = history.events()
    assert not event.complete
    assert len(event.updated_text) <= MAX_EVENT_CHARS
    buffer.edit(3, 0, "", "y")
    assert len(history) == 2


def test_an_edit_that_does_not_match_the_lines_is_not_recorded() -> None:
    history = EditHistory()
    assert not history.record_edit("a.py", ["abc\n", ""], 0, 0, "", "zz")
    assert not history.record_edit("a.py", ["abc\n", ""], 0, 0, "q", "q")
    assert not history.record_edit("a.py", ["abc\n", ""], 5, 0, "", "a")
    assert len(history) == 0


@pytest.mark.parametrize(
    ("text", "line", "character", "removed", "inserted"),
    [
        pytest.param("a\nb\n", 1, 1, "", "\n", id="new line at the end"),
        pytest.param("a\n", 1, 0, "b", "", id="last line emptied"),
        pytest.param("ax\r\nb\r\n", 0, 1, "", "x", id="crlf"),
        pytest.param("a\n", 0, 1, "\nb\nc", "", id="lines joined"),
    ],
)
def test_regions_match_the_document_at_its_edges(
    text: str, line: int, character: int, removed: str, inserted: str
) -> None:
    """`text` is the document after the edit; the region is its lines, and the original holds
    what was removed."""
    history = EditHistory()
    assert history.record_edit("a.py", document_lines(text), line, character, removed, inserted)
    (event,) = history.events()
    assert tuple(document_lines(text)[event.start : event.end]) == event.updated
    restored = event.original_text
    assert removed in restored


@st.composite
def edit_sessions(draw: st.DrawFn) -> list[tuple[float, int, int, int, str]]:
    """(pause before, line, character, characters removed, text inserted) per edit."""
    return draw(
        st.lists(
            st.tuples(
                st.sampled_from([0.1, 0.3, 2.0]),
                st.integers(0, 45),
                st.integers(0, 9),
                st.integers(0, 12),
                st.sampled_from(["", "x", "yy\n", "\n", "z\nw", "\r\n"]),
            ),
            min_size=1,
            max_size=25,
        )
    )


@settings(max_examples=300, deadline=None)
@given(session=edit_sessions())
def test_the_latest_event_is_the_document_now_and_before_its_first_edit(
    session: list[tuple[float, int, int, int, str]],
) -> None:
    clock = Clock()
    history = EditHistory(clock=clock)
    buffer = Buffer(history)
    before_event = buffer.text  # the text before the latest event's first edit
    for pause, line, character, length, inserted in session:
        clock.now += pause
        lines = list(document_lines(buffer.text))
        line = min(line, len(lines) - 1)
        offset = sum(map(len, lines[:line])) + min(character, len(lines[line].rstrip("\r\n")))
        if buffer.text[offset - 1 : offset + 1] == "\r\n":
            offset -= 1  # never split a line break in two
        removed = buffer.text[offset : offset + length]
        if removed.endswith("\r") and buffer.text[offset + length : offset + length + 1] == "\n":
            removed = removed[:-1]
        events_before = history.events()
        text_before = buffer.text
        recorded = buffer.edit(line, offset - sum(map(len, lines[:line])), removed, inserted)
        events = history.events()
        if recorded and (len(events) != len(events_before) or events[-1].edits == 1):
            before_event = text_before
    event = history.events()[-1] if len(history) else None
    if event is None or not event.complete:
        return
    now = document_lines(buffer.text)
    assert tuple(now[event.start : event.end]) == event.updated
    then = document_lines(before_event)
    assert tuple(then[event.start : event.start + len(event.original)]) == event.original
