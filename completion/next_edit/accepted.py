"""What accepting a prediction leads to: the document, the cursor and the history after it.

The editors apply a prediction's edits as one change, the last edit first, and put the cursor
right after the last one (`accept` in `editors/vscode/src/nextEdit.ts` and in
`editors/neovim/lua/tabloop/next_edit.lua`). The server records that change in its history as
an event of its own, never merged into the user's edit before it (`EditHistory.record_edit`'s
`new_event`): an accepted prediction is not the user's typing, and the histories the model
learns from (replayed commits) show each edit as its own event. `accepted_state` makes the same
state ahead of time, so that the prediction there can be computed while the user still reads
this one (the server's prefetch, `lsp_server.features.next_edit`). It is a guess at a state,
never an answer: a later request is answered from what was computed only when it builds the very
same prompt (`NextEditPredictor`'s kept rewrites).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from completion.next_edit.diff import Edit
from completion.next_edit.history import EditHistory
from completion.next_edit.text import breaks, lines_of


@dataclass(frozen=True)
class AcceptedState:
    """The document's lines after the edits, the cursor after the last one, and when the
    acceptance was recorded on the history's clock."""

    lines: tuple[str, ...]
    cursor: tuple[int, int]
    at: float


def applied(lines: Sequence[str], edits: Sequence[Edit]) -> tuple[str, ...]:
    """The document `lines` (LSP lines, with their breaks) with `edits` applied (sorted, not
    overlapping, in its coordinates); the lines no edit touches are the same objects."""
    after = list(lines)
    for edit in reversed(edits):
        _apply(after, edit)
    return tuple(after)


def accepted_state(
    lines: Sequence[str], edits: Sequence[Edit], history: EditHistory, path: str
) -> AcceptedState:
    """Apply `edits` (sorted, not overlapping, in document coordinates of `lines`) as an editor
    accepting them does, the last first, recording them in `history` (a copy:
    `EditHistory.snapshot`) under `path` as the server records the editor's change: one event
    of their own, on the history's clock."""
    if not edits:
        raise ValueError("nothing to accept: the prediction has no edits")
    now = history.clock()
    after = list(lines)
    for index, edit in enumerate(reversed(edits)):
        removed = _apply(after, edit)
        history.record_edit(
            path,
            after,
            edit.start_line,
            edit.start_character,
            removed,
            edit.text,
            now=now,
            new_event=index == 0,
        )
    return AcceptedState(tuple(after), cursor_after(edits), now)


def cursor_after(edits: Sequence[Edit]) -> tuple[int, int]:
    """Where the cursor lands after `edits` are applied: right after the last one's text."""
    line_shift = 0
    # The previous edit's end: its line and column before it, and its column after applying it.
    end_line, previous_end, end_column = -1, 0, 0
    line = column = 0
    for edit in edits:
        start = edit.start_character
        if edit.start_line == end_line:  # on the line where the previous edit ended
            start = end_column + (edit.start_character - previous_end)
        written = breaks(edit.text)
        if written:
            column = len(edit.text) - max(edit.text.rfind("\n"), edit.text.rfind("\r")) - 1
        else:
            column = start + len(edit.text)
        line = edit.start_line + line_shift + written
        line_shift += written - (edit.end_line - edit.start_line)
        end_line, end_column, previous_end = edit.end_line, column, edit.end_character
    return line, column


def _apply(lines: list[str], edit: Edit) -> str:
    """Replace `edit`'s range in `lines` (LSP lines, with their breaks) with its text, in place;
    the text removed."""
    first, last = edit.start_line, edit.end_line
    if not 0 <= first <= last < len(lines):
        raise ValueError(f"edit {edit.range} is outside the document ({len(lines)} lines)")
    region = "".join(lines[first : last + 1])
    end = len(region) - len(lines[last]) + edit.end_character
    removed = region[edit.start_character : end]
    text = region[: edit.start_character] + edit.text + region[end:]
    replaced = lines_of(text)
    if last == len(lines) - 1 and (not replaced or replaced[-1].endswith(("\n", "\r"))):
        replaced.append("")  # the document's last line, empty after a final break
    lines[first : last + 1] = replaced
    return removed
