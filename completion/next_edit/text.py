"""Text as lines the way LSP counts them (breaks at `\\n`, `\\r\\n` and `\\r` only)."""

from __future__ import annotations

import re
from collections.abc import Sequence

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


def lines_of(text: str) -> list[str]:
    """`text` as lines, each with its line break; a last line without one is kept, and no empty
    line is added after a final break (so `"".join(lines_of(text)) == text`)."""
    return _LINE.findall(text)


def document_lines(text: str | Sequence[str]) -> Sequence[str]:
    """A document as LSP lines: a sequence of lines is taken as it is; a string is split, with
    the empty last line LSP counts after a final break."""
    if not isinstance(text, str):
        return text
    lines = lines_of(text)
    if not lines or lines[-1].endswith(("\n", "\r")):
        lines.append("")
    return lines


def breaks(text: str) -> int:
    """How many line breaks `text` holds (`\\r\\n` is one)."""
    return text.count("\n") + text.count("\r") - text.count("\r\n")


def common_ends(before: Sequence[str], after: Sequence[str]) -> tuple[int, int]:
    """How many items two sequences share at their start, and then at their end (never
    overlapping): what a change from `before` to `after` left as it was around it."""
    head = 0
    while head < min(len(before), len(after)) and before[head] == after[head]:
        head += 1
    tail = 0
    while (
        tail < min(len(before), len(after)) - head
        and before[len(before) - 1 - tail] == after[len(after) - 1 - tail]
    ):
        tail += 1
    return head, tail
