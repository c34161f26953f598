"""Minimal edits from a rewritten window, and the guards."""

from __future__ import annotations

import pytest

from completion.next_edit.diff import Edit, reverts, undoes, window_edits, writes_outside
from completion.next_edit.history import EditHistory
from completion.next_edit.prompt import Window
from completion.next_edit.text import document_lines

DOC = "".join(f"row {n}\n" for n in range(20))


def apply(text: str, edits: list[Edit]) -> str:
    lines = list(document_lines(text))

    def offset(line: int, character: int) -> int:
        return sum(map(len, lines[:line])) + character

    for edit in reversed(edits):
        start = offset(edit.start_line, edit.start_character)
        end = offset(edit.end_line, edit.end_character)
        text = text[:start] + edit.text + text[end:]
    return text


def window(start: int = 5, end: int = 12, text: str = DOC) -> Window:
    return Window(start, tuple(document_lines(text)[start:end]))


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param("row 7\n", "row 7!\n", [Edit(7, 5, 7, 5, "!")], id="insert in a line"),
        pytest.param("row 7\n", "col 7\n", [Edit(7, 0, 7, 3, "col")], id="replace a word"),
        pytest.param("row 6\n", "", [Edit(6, 0, 7, 0, "")], id="delete a line"),
        pytest.param("row 8\n", "row 8\nnew\n", [Edit(9, 0, 9, 0, "new\n")], id="add a line"),
    ],
)
def test_small_rewrites_become_small_edits(old: str, new: str, expected: list[Edit]) -> None:
    current = window()
    predicted = current.text.replace(old, new)
    edits = window_edits(current, predicted)
    assert edits == expected
    assert apply(DOC, edits) == DOC.replace(old, new)


def test_changes_in_two_places_are_two_sorted_edits() -> None:
    current = window()
    predicted = current.text.replace("row 6", "item 6").replace("row 10", "item 10")
    edits = window_edits(current, predicted)
    assert [e.range for e in edits] == [(6, 0, 6, 3), (10, 0, 10, 3)]
    assert apply(DOC, edits) == DOC.replace("row 6", "item 6").replace("row 10", "item 10")


def test_the_same_text_is_no_edit() -> None:
    assert window_edits(window(), window().text) == []


def test_an_insertion_at_the_window_end_is_placed_on_the_next_line() -> None:
    current = window()
    edits = window_edits(current, current.text + "tail\n")
    assert edits == [Edit(12, 0, 12, 0, "tail\n")]
    assert not writes_outside(current, edits, document_lines(DOC))


def test_a_rewrite_that_carries_on_past_the_window_is_refused() -> None:
    current = window()
    lines = document_lines(DOC)
    edits = window_edits(current, current.text + "row 12\nrow 13\n")
    assert writes_outside(current, edits, lines)
    edits = window_edits(current, "row 4\n" + current.text)
    assert writes_outside(current, edits, lines)


def test_an_edit_outside_the_window_is_refused() -> None:
    current = window()
    assert writes_outside(current, [Edit(2, 0, 2, 1, "x")], document_lines(DOC))
    assert writes_outside(current, [Edit(11, 0, 13, 0, "")], document_lines(DOC))


def edited(history: EditHistory, text: str, row: int, now: float) -> str:
    """`text` with " changed" put at the end of row `row`, recorded in `history` at `now`."""
    after = text.replace(f"row {row}\n", f"row {row} changed\n")
    history.record_edit(
        "a.py", document_lines(after), row, len(f"row {row}"), "", " changed", now=now
    )
    return after


def test_a_rewrite_that_puts_the_last_edit_back_is_an_undo() -> None:
    history = EditHistory(clock=lambda: 0.0)
    current = window(text=edited(history, DOC, 8, 0.0))
    latest = history.latest("a.py")
    assert undoes(current, current.text.replace(" changed", ""), latest)
    # Put back, and something else changed below it: still an undo.
    partly = current.text.replace(" changed", "").replace("row 11", "row eleven")
    assert undoes(current, partly, latest)
    assert not undoes(current, current.text.replace("row 11", "row eleven"), latest)


def test_a_rewrite_that_reverts_an_earlier_edit_anywhere_in_it() -> None:
    # Row 8 edited, then row 12 after a pause: row 8's edit is no longer the latest.
    history = EditHistory(clock=lambda: 0.0)
    current = window(text=edited(history, edited(history, DOC, 8, 0.0), 12, 5.0))
    edits, latest = history.in_document("a.py"), history.latest("a.py")
    assert len(edits) == 2
    back = current.text.replace("row 8 changed", "row 8")
    assert reverts(current.text, back, edits) and not undoes(current, back, latest)
    assert reverts(current.text, current.text.replace("row 8 changed", "row  8"), edits)
    # Building on the edit, or changing something else, is not reverting it.
    assert not reverts(current.text, current.text.replace("8 changed", "8 changed twice"), edits)
    assert not reverts(current.text, current.text.replace("row 11", "row eleven"), edits)
    assert not reverts(current.text, current.text, edits)
    assert not reverts(current.text, back, [])
