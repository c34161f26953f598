"""The next-edit history as the server records it from a `didChange`: a batch of edits, each
against the text it left, and a whole-text change as the edit it makes."""

from __future__ import annotations

from lsprotocol import types

from completion.next_edit import EditHistory
from lsp_server.documents import Document
from lsp_server.features.next_edit import record_change

SOURCE = "def area(width, height):\n    return width * height\n\n\nprint(area(1, 2))\n"
RENAMED = SOURCE.replace("area(width,", "area(w,")


def partial(line: int, start: int, end: int, text: str) -> types.TextDocumentContentChangePartial:
    return types.TextDocumentContentChangePartial(
        range=types.Range(types.Position(line, start), types.Position(line, end)), text=text
    )


def recorded(*changes: types.TextDocumentContentChangeEvent) -> EditHistory:
    """The history after one `didChange` with `changes` to `SOURCE`."""
    document = Document("file:///ws/a.py", SOURCE, version=1)
    for change in changes:
        document.apply_change(change)
    history = EditHistory(clock=lambda: 100.0)
    record_change(history, "a.py", document.take_change(), document.lines)
    return history


def test_a_deletion_and_the_text_typed_in_its_place_are_one_rename() -> None:
    # Neovim's `cw` then `w`: "width" deleted, then "w" inserted where it was.
    history = recorded(partial(0, 9, 14, ""), partial(0, 9, 9, "w"))
    (event,) = history.events()
    assert event.edits == 2
    assert event.original_text == "def area(width, height):\n    return width * height\n\n"
    assert event.updated_text == "def area(w, height):\n    return width * height\n\n"


def test_edits_at_several_cursors_are_each_read_in_the_text_they_left() -> None:
    # Two cursors on lines 0 and 1; the second edit's columns are in the text the first left.
    history = recorded(partial(1, 11, 16, "w"), partial(0, 9, 14, "w"))
    (event,) = history.events()
    assert event.original_text == "def area(width, height):\n    return width * height\n\n\n"
    assert event.updated_text == "def area(w, height):\n    return w * height\n\n\n"


def test_a_whole_text_change_is_recorded_as_the_edit_it_makes() -> None:
    history = recorded(types.TextDocumentContentChangeWholeDocument(text=RENAMED))
    (event,) = history.events()
    assert (event.start, event.edits) == (0, 1)
    assert event.original_text == "def area(width, height):\n    return width * height\n\n"
    assert event.updated_text == "def area(w, height):\n    return width * height\n\n"


def test_a_whole_text_change_bigger_than_a_block_forgets_the_document() -> None:
    history = recorded(
        partial(0, 9, 14, "w"),
        types.TextDocumentContentChangeWholeDocument(text="x = 1\n" * 1000),
        partial(0, 0, 0, "#"),
    )
    # The rename is forgotten; the edit after the rewrite is read in the text it left.
    (event,) = history.events()
    assert event.original_text == "x = 1\n" * 3
    assert event.updated_text == "#x = 1\n" + "x = 1\n" * 2
