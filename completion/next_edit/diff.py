"""The smallest edits that turn the current window into the predicted one, and the guards.

Lines are matched first (difflib), then the characters of each changed block, so a one-word
change in a long line is one small edit; changes closer than `JOIN_CHARS` characters are joined
into one edit, so an edit never splits a word into fragments. Edits are in document coordinates
(line, character in code points), sorted, and never overlap.

A prediction is refused (and nothing is shown) when it:
- would write past the window: it ends with the lines that follow the window in the document,
  or starts with those before it (the model rewrote more than it was given, so applying it would
  write those lines twice), or an edit falls outside the window;
- undoes the user's latest edit: its region comes back as it was before that edit;
- reverts one of the user's recent edits in the document, wherever it now is: some changed block
  of the prediction takes out what that edit put in and puts back what it took out (whitespace
  aside; `reverts`, the rule `tabloop eval edits` counts reversals by).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from completion.next_edit.history import EditEvent
from completion.next_edit.prompt import Window
from completion.next_edit.text import lines_of

JOIN_CHARS = 3


@dataclass(frozen=True)
class Edit:
    """Replace the text from (`start_line`, `start_character`) to (`end_line`,
    `end_character`) (code points, document coordinates) with `text`; `removed` is the text
    replaced."""

    start_line: int
    start_character: int
    end_line: int
    end_character: int
    text: str
    removed: str = field(default="", compare=False)

    @property
    def range(self) -> tuple[int, int, int, int]:
        return (self.start_line, self.start_character, self.end_line, self.end_character)


def window_edits(window: Window, predicted: str) -> list[Edit]:
    """The edits that turn `window`'s text into `predicted`; [] when they are the same."""
    current = window.text
    if predicted == current:
        return []
    old_lines, new_lines = lines_of(current), lines_of(predicted)
    starts = [0]
    for line in old_lines:
        starts.append(starts[-1] + len(line))
    spans: list[tuple[int, int, str]] = []  # (start, end) offsets in `current`, new text
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        old, new = "".join(old_lines[i1:i2]), "".join(new_lines[j1:j2])
        spans.extend((starts[i1] + a, starts[i1] + b, text) for a, b, text in _char_spans(old, new))
    return [_edit(window, current, start, end, text) for start, end, text in spans]


def _char_spans(old: str, new: str) -> list[tuple[int, int, str]]:
    """(start, end, text) replacements in `old` that give `new`, changes closer than
    `JOIN_CHARS` joined."""
    spans: list[list[int]] = []  # [old start, old end, new start, new end]
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if spans and i1 - spans[-1][1] < JOIN_CHARS and j1 - spans[-1][3] < JOIN_CHARS:
            spans[-1][1], spans[-1][3] = i2, j2
        else:
            spans.append([i1, i2, j1, j2])
    return [(i1, i2, new[j1:j2]) for i1, i2, j1, j2 in spans]


def _edit(window: Window, current: str, start: int, end: int, text: str) -> Edit:
    start_line, start_character = _position(window, start)
    end_line, end_character = _position(window, end)
    return Edit(start_line, start_character, end_line, end_character, text, current[start:end])


def _position(window: Window, offset: int) -> tuple[int, int]:
    """Document (line, character) of an offset in the window's text; the end of a line's
    break is the next line's start."""
    line_start = 0
    for index, text in enumerate(window.lines):
        if offset < line_start + len(text):
            return window.start + index, offset - line_start
        line_start += len(text)
    return window_end(window)


def window_end(window: Window) -> tuple[int, int]:
    """The document position just after the window's text."""
    if not window.lines:
        return window.start, 0
    last = window.lines[-1]
    if last.endswith(("\n", "\r")):
        return window.end, 0
    return window.end - 1, len(last)


def writes_outside(window: Window, edits: Sequence[Edit], lines: Sequence[str]) -> bool:
    """Whether the edits reach past the window, or write again the document's lines just
    before or after it (`lines`: the whole document)."""
    if not edits:
        return False
    end_line, end_character = window_end(window)
    for edit in edits:
        if (edit.start_line, edit.start_character) < (window.start, 0):
            return True
        if (edit.end_line, edit.end_character) > (end_line, end_character):
            return True
    first, last = edits[0], edits[-1]
    if (last.end_line, last.end_character) == (end_line, end_character):
        after = "".join(lines[window.end : window.end + 3])
        if _repeats(last.text, after, at_end=True):
            return True
    if (first.start_line, first.start_character) == (window.start, 0):
        before = "".join(lines[max(0, window.start - 3) : window.start])
        if _repeats(first.text, before, at_end=False):
            return True
    return False


def _repeats(text: str, neighbours: str, *, at_end: bool) -> bool:
    """Whether `text` ends (`at_end`) or starts with one or more whole non-blank lines of
    `neighbours` (the lines after the window, nearest first; or before it, nearest last)."""
    lines = lines_of(neighbours)
    for count in range(1, len(lines) + 1):
        part = lines[:count] if at_end else lines[-count:]
        piece = "".join(part)
        if not piece.strip():
            continue
        aligned = len(text) == len(piece) or text[-len(piece) - 1 : -len(piece)] in ("\n", "\r")
        if at_end and text.endswith(piece) and aligned:
            return True
        if not at_end and text.startswith(piece):
            return True
    return False


def undoes(window: Window, predicted: str, latest: EditEvent | None) -> bool:
    """Whether `predicted` (the window's new text) puts the latest edit's region back as it was
    before that edit."""
    if latest is None or not latest.complete or latest.original == latest.updated:
        return False
    if latest.start < window.start or latest.end > window.end:
        return False
    offset = latest.start - window.start
    if window.lines[offset : offset + len(latest.updated)] != latest.updated:
        return False
    head = "".join(window.lines[:offset])
    return predicted.startswith(head + latest.original_text)


class Reversible(Protocol):
    """An edit as `reverts` reads it: the text it removed and the text it inserted."""

    @property
    def removed(self) -> str: ...

    @property
    def inserted(self) -> str: ...


def reverts(before: str, after: str, edits: Sequence[Reversible]) -> bool:
    """Whether changing `before` into `after` undoes one of `edits`: some changed block of lines
    removes what the edit inserted and puts back what it removed (whitespace aside), so the edit
    and the change cancel out. A change that only adds to an edit, or reverts part of one, is
    not counted."""
    if before == after:
        return False
    undone = set()
    for edit in edits:
        removed, inserted = _changed_region(_squeezed(edit.removed), _squeezed(edit.inserted))
        if removed != inserted:  # whitespace-only edits are not judged
            undone.add((inserted, removed))
    if not undone:
        return False
    old_lines, new_lines = lines_of(before), lines_of(after)
    matcher = difflib.SequenceMatcher(None, old_lines, new_lines, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        old, new = "".join(old_lines[i1:i2]), "".join(new_lines[j1:j2])
        if _changed_region(_squeezed(old), _squeezed(new)) in undone:
            return True
    return False


def _changed_region(before: str, after: str) -> tuple[str, str]:
    """(removed, inserted): what differs between two texts once their common prefix and suffix
    are set aside."""
    head = 0
    limit = min(len(before), len(after))
    while head < limit and before[head] == after[head]:
        head += 1
    tail = 0
    while tail < limit - head and before[-1 - tail] == after[-1 - tail]:
        tail += 1
    return before[head : len(before) - tail], after[head : len(after) - tail]


def _squeezed(text: str) -> str:
    return "".join(text.split())
