"""The window the model rewrites, and the next-edit prompt for a Qwen2.5-Coder base model.

The prompt follows Sweep's open next-edit models, whose evaluation found the model's own
`<|file_sep|>` token better than multi-token markers and plain original/updated blocks better
than unified diffs:

    <|file_sep|>{path}.diff        (one per recent edit, the latest last)
    original:
    {the edit's region before it}
    updated:
    {the region after it}
    <|file_sep|>original/{path}
    {the window before the latest edit}
    <|file_sep|>current/{path}
    {the window now}
    <|file_sep|>updated/{path}

and the model writes the updated window, ending it with `<|file_sep|>`.

The window is the cursor's line and up to `window_lines` lines on each side, nearest first,
while their tokens fit `window_tokens`: a line that does not fit (or is longer than any window
could hold) ends the window on its side, so the window shrinks around the cursor instead of
cutting a line. Only the window's own lines are measured, never the document.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from completion.next_edit.history import EditEvent
from completion.next_edit.settings import NextEditSettings

FILE_SEP = "<|file_sep|>"
# No model token is longer than this many characters of code, so a line with more characters
# than this times the budget cannot fit, and is not tokenized to find out.
MAX_CHARS_PER_TOKEN = 16


@dataclass(frozen=True)
class Window:
    """Lines `start` to `start + len(lines)` of the document (each with its break), and their
    tokens."""

    start: int
    lines: tuple[str, ...]
    tokens: int = 0

    @property
    def end(self) -> int:
        """The line after the window."""
        return self.start + len(self.lines)

    @property
    def text(self) -> str:
        return "".join(self.lines)


def choose_window(
    lines: Sequence[str],
    cursor_line: int,
    *,
    radius: int,
    max_tokens: int,
    count_tokens: Callable[[str], int],
) -> Window | None:
    """The window around `cursor_line` under the budget; None when the cursor's own line does
    not fit."""
    if not lines:
        return None
    cursor_line = max(0, min(cursor_line, len(lines) - 1))

    def cost(line: str) -> int | None:
        if len(line) > max_tokens * MAX_CHARS_PER_TOKEN:
            return None
        return count_tokens(line)

    first = cost(lines[cursor_line])
    if first is None or first > max_tokens:
        return None
    used = first
    start, end = cursor_line, cursor_line + 1
    below = above = True
    for _ in range(radius):
        if below and end < len(lines):
            tokens = cost(lines[end])
            if tokens is not None and used + tokens <= max_tokens:
                used += tokens
                end += 1
            else:
                below = False
        if above and start > 0:
            tokens = cost(lines[start - 1])
            if tokens is not None and used + tokens <= max_tokens:
                used += tokens
                start -= 1
            else:
                above = False
    return Window(start, tuple(lines[start:end]), used)


def settings_window(
    lines: Sequence[str],
    cursor_line: int,
    settings: NextEditSettings,
    count_tokens: Callable[[str], int],
) -> Window | None:
    """`choose_window` with the radius and budget of `settings`: the window the predictor
    rewrites."""
    return choose_window(
        lines,
        cursor_line,
        radius=settings.window_lines,
        max_tokens=settings.window_tokens,
        count_tokens=count_tokens,
    )


def original_window(window: Window, latest: EditEvent | None) -> str:
    """The window's text before the latest edit: its region put back as it was, when the region
    lies inside the window (else the window as it is)."""
    if latest is None or not latest.complete:
        return window.text
    if latest.start < window.start or latest.end > window.end:
        return window.text
    offset = latest.start - window.start
    lines = window.lines
    if lines[offset : offset + len(latest.updated)] != latest.updated:
        return window.text  # the region moved since (not this document's text)
    return "".join((*lines[:offset], *latest.original, *lines[offset + len(latest.updated) :]))


def render_event(event: EditEvent) -> str:
    """One recent edit as an original/updated block pair."""
    return (
        f"{FILE_SEP}{event.path}.diff\n"
        f"original:\n{_block(event.original_text)}"
        f"updated:\n{_block(event.updated_text)}"
    )


def history_blocks(
    events: Sequence[EditEvent],
    *,
    max_events: int,
    max_tokens: int,
    count_tokens: Callable[[str], int],
) -> list[str]:
    """The rendered blocks of the latest `max_events` events, oldest first, as many of the
    newest as fit `max_tokens`."""
    blocks: list[str] = []
    used = 0
    for event in reversed(events[-max_events:] if max_events else []):
        block = render_event(event)
        tokens = count_tokens(block)
        if used + tokens > max_tokens:
            break
        used += tokens
        blocks.append(block)
    return blocks[::-1]


def next_event_prefix(
    events: Sequence[EditEvent],
    *,
    max_events: int,
    max_tokens: int,
    count_tokens: Callable[[str], int],
) -> str:
    """How the prompt of a prediction in an event after `events` starts: the blocks of the
    newest `max_events - 1` of them, to which that event's own block is added (empty when the
    prompt shows one event or none). The prompt then starts so unless the new event's block
    does not fit `max_tokens` beside them, and its oldest block is left out."""
    if max_events <= 1:
        return ""
    blocks = history_blocks(
        events, max_events=max_events - 1, max_tokens=max_tokens, count_tokens=count_tokens
    )
    return "".join(blocks)


def build_prompt(path: str, history: Sequence[str], original: str, window: Window) -> str:
    """The whole prompt: `history` blocks (from `history_blocks`), then the original, current
    and (open) updated window of `path`."""
    return (
        "".join(history)
        + f"{FILE_SEP}original/{path}\n{_block(original)}"
        + f"{FILE_SEP}current/{path}\n{_block(window.text)}"
        + f"{FILE_SEP}updated/{path}\n"
    )


def _block(text: str) -> str:
    """`text` ending with a line break, so the next marker starts a line."""
    return text if text.endswith(("\n", "\r")) or not text else text + "\n"
