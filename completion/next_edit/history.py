"""The recent edits of a workspace, as the next-edit prompt shows them.

Rules (after Zed's edit prediction): consecutive edits in the same document merge into one event
while each lands within `MERGE_LINES` lines of the event's region and comes less than `PAUSE_S`
after the previous one; a pause or a jump starts a new event. The workspace keeps its last
`MAX_EVENTS` events. An event is a region of whole lines, `CONTEXT_LINES` lines of context on each
side of the edits, with the region's text before the event's first edit (`original`) and now
(`updated`).

Memory is bounded: each block of an event keeps at most `MAX_EVENT_CHARS` characters (a bigger
event is kept cut, marked incomplete, and never merged into), so a workspace's history holds at
most `MAX_EVENTS * 2 * MAX_EVENT_CHARS` characters of text. Recording an edit reads only the
lines it touches and the region around it.

Edits come as the language server records them: the position where an edit starts, the text it
removed and the text it inserted, and the document's lines after it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from completion.next_edit.text import breaks, lines_of

MERGE_LINES = 8
PAUSE_S = 1.0
MAX_EVENTS = 6
CONTEXT_LINES = 2
MAX_EVENT_CHARS = 2048


@dataclass(frozen=True)
class EditEvent:
    """Edits in one document merged into one region of whole lines.

    `start` is the region's first line in the document now (kept up to date as later edits
    above it move it); `original` is the region's text before the event, `updated` its text
    after the event's last edit. `complete` is False when a block was cut to `MAX_EVENT_CHARS`.
    """

    path: str
    start: int
    original: tuple[str, ...]
    updated: tuple[str, ...]
    first_at: float
    last_at: float
    edits: int = 1
    complete: bool = True

    @property
    def end(self) -> int:
        """The line after the region, in the document now."""
        return self.start + len(self.updated)

    @property
    def original_text(self) -> str:
        return "".join(self.original)

    @property
    def updated_text(self) -> str:
        return "".join(self.updated)

    # As `completion.next_edit.diff.reverts` reads an edit.
    @property
    def removed(self) -> str:
        return self.original_text

    @property
    def inserted(self) -> str:
        return self.updated_text


class EditHistory:
    """The last events of one workspace, oldest first; thread-safe.

    `clock` gives seconds (monotonic in the server, simulated in replays and tests); every
    method that needs the time also takes an explicit `now`.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_events: int = MAX_EVENTS,
        merge_lines: int = MERGE_LINES,
        pause_s: float = PAUSE_S,
        context_lines: int = CONTEXT_LINES,
        max_event_chars: int = MAX_EVENT_CHARS,
    ) -> None:
        self.clock = clock
        self.merge_lines = merge_lines
        self.pause_s = pause_s
        self.context_lines = context_lines
        self.max_event_chars = max_event_chars
        self._events: deque[EditEvent] = deque(maxlen=max_events)
        self._lock = threading.Lock()

    # -- reading ------------------------------------------------------------------------------

    def events(self) -> list[EditEvent]:
        """Every event kept, oldest first."""
        with self._lock:
            return list(self._events)

    def in_document(self, path: str) -> list[EditEvent]:
        """The events kept in document `path`, oldest first."""
        with self._lock:
            return [e for e in self._events if e.path == path]

    def latest(self, path: str) -> EditEvent | None:
        """The most recent event in document `path`, or None."""
        with self._lock:
            return next((e for e in reversed(self._events) if e.path == path), None)

    def __len__(self) -> int:
        return len(self._events)

    def snapshot(self) -> EditHistory:
        """A copy of the history as it is now (its events are immutable), on the same clock and
        rules: what a prediction saw, kept while later edits go on in this one."""
        copy = EditHistory(
            clock=self.clock,
            max_events=self._events.maxlen or MAX_EVENTS,
            merge_lines=self.merge_lines,
            pause_s=self.pause_s,
            context_lines=self.context_lines,
            max_event_chars=self.max_event_chars,
        )
        with self._lock:
            copy._events.extend(self._events)
        return copy

    # -- recording ----------------------------------------------------------------------------

    def record_edit(
        self,
        path: str,
        lines: Sequence[str],
        line: int,
        character: int,
        removed: str,
        inserted: str,
        now: float | None = None,
        *,
        new_event: bool = False,
    ) -> bool:
        """An edit in document `path`: at (`line`, `character`, code points) `removed` was
        replaced by `inserted`; `lines` are the document's lines (with their breaks) after it.
        `new_event` starts an event even where the edit would merge into the last one (the
        server's rule for an accepted prediction: it is not the user's typing).

        False when nothing was recorded: the edit changed nothing, the position is not in the
        document, or `lines` do not hold `inserted` at that place (they are not the text after
        this edit).
        """
        if removed == inserted or not 0 <= line < len(lines):
            return False
        if not 0 <= character <= len(lines[line].rstrip("\r\n")):
            return False  # a position past the line's end is not a place in it
        now = self.clock() if now is None else now
        count = breaks(inserted) + 1
        after_text = "".join(lines[line : line + count])
        if after_text[character : character + len(inserted)] != inserted:
            return False
        before_text = after_text[:character] + removed + after_text[character + len(inserted) :]
        before = lines_of(before_text)
        if line + count == len(lines) and (not before or before[-1].endswith(("\n", "\r"))):
            before.append("")  # the document's last line, empty after a final break
        change = _LineChange(line, tuple(before), tuple(lines[line : line + count]))
        with self._lock:
            self._record(path, lines, change, now, new_event)
        return True

    def forget(self, path: str) -> None:
        """Drop the events of document `path` (its text was replaced as a whole)."""
        with self._lock:
            kept = [e for e in self._events if e.path != path]
            self._events.clear()
            self._events.extend(kept)

    def _record(
        self, path: str, lines: Sequence[str], change: _LineChange, now: float, new_event: bool
    ) -> None:
        last = self._events[-1] if self._events else None
        merging = (
            not new_event
            and last is not None
            and last.path == path
            and last.complete
            and now - last.last_at < self.pause_s
            and change.line <= last.end + self.merge_lines
            and change.before_end >= last.start - self.merge_lines
        )
        # Events below the edit move with it; the one merged into is rebuilt below.
        merged = len(self._events) - 1 if merging else -1
        for index, event in enumerate(self._events):
            if event.path == path and event.start >= change.before_end and index != merged:
                self._events[index] = replace(event, start=event.start + change.delta)
        context = self.context_lines
        before_count = len(lines) - change.delta
        start = max(0, change.line - context)
        end = min(before_count, change.before_end + context)
        if merging and last is not None:
            region_start, region_end = min(start, last.start), max(end, last.end)
            original = (
                *change.before_lines(lines, region_start, last.start),
                *last.original,
                *change.before_lines(lines, last.end, region_end),
            )
            first_at, edits = last.first_at, last.edits + 1
            self._events.pop()
        else:
            region_start, region_end = start, end
            original = tuple(change.before_lines(lines, start, end))
            first_at, edits = now, 1
        updated = tuple(lines[region_start : region_end + change.delta])
        original, cut_original = _capped(original, self.max_event_chars)
        updated, cut_updated = _capped(updated, self.max_event_chars)
        self._events.append(
            EditEvent(
                path,
                region_start,
                original,
                updated,
                first_at=first_at,
                last_at=now,
                edits=edits,
                complete=not (cut_original or cut_updated),
            )
        )


@dataclass(frozen=True)
class _LineChange:
    """An edit as whole lines: from `line` on, `before` lines became `after` lines."""

    line: int
    before: tuple[str, ...]
    after: tuple[str, ...]

    @property
    def before_end(self) -> int:
        return self.line + len(self.before)

    @property
    def delta(self) -> int:
        return len(self.after) - len(self.before)

    def before_lines(self, lines: Sequence[str], start: int, end: int) -> list[str]:
        """Lines `start` to `end` (exclusive) of the document as it was before this edit, read
        from `lines` (the document after it)."""
        found: list[str] = []
        for index in range(start, end):
            if index < self.line:
                found.append(lines[index])
            elif index < self.before_end:
                found.append(self.before[index - self.line])
            else:
                found.append(lines[index + self.delta])
        return found


def _capped(block: tuple[str, ...], limit: int) -> tuple[tuple[str, ...], bool]:
    """`block` cut to at most `limit` characters (whole lines, the last one cut), and whether
    it was cut."""
    if sum(map(len, block)) <= limit:
        return block, False
    kept: list[str] = []
    left = limit
    for line in block:
        if left <= 0:
            break
        kept.append(line[:left])
        left -= len(line)
    return tuple(kept), True
