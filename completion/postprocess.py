"""What to do with raw model text: when to stop generating it, and how to clean it for showing.

`stop_rule` runs inside the decode loop (after every token), so a suggestion ends where an editor
user expects it to, without paying for tokens that would be thrown away. `clean` runs once on the
final text and removes what would make a suggestion wrong or annoying to accept.
"""

from __future__ import annotations

import re

from common.languages import is_indented
from completion.types import CompletionRequest, StopRule

DEFAULT_MAX_LINES = 16
"""Most lines of one multi-line suggestion."""

_OPENERS = {"(": ")", "[": "]", "{": "}"}
_CLOSERS = {v: k for k, v in _OPENERS.items()}
_QUOTES = "\"'`"


def _indent(line: str) -> int:
    """Width of a line's leading whitespace (tabs count as 4)."""
    width = 0
    for ch in line:
        if ch == " ":
            width += 1
        elif ch == "\t":
            width += 4
        else:
            break
    return width


def _line_starts(text: str) -> list[int]:
    """Offsets where each line of `text` begins."""
    starts = [0]
    starts.extend(i + 1 for i, ch in enumerate(text) if ch == "\n")
    return starts


def _cut_at_line(text: str, start: int) -> int:
    """Cut offset that drops the line beginning at `start` and the blank lines before it."""
    return len(text[:start].rstrip())


def _cap_lines(text: str, max_lines: int) -> int | None:
    """Cut after `max_lines` lines. A suggestion made at the end of a line starts with a line
    break (it writes the next line): that empty first line is not one of them."""
    starts = _line_starts(text)
    if len(starts) > 1 and starts[1] == 1:
        starts = starts[1:]
    if len(starts) > max_lines:
        return _cut_at_line(text, starts[max_lines])
    return None


def _indentation_stop(text: str, request: CompletionRequest) -> int | None:
    """Cut before the first complete line that dedents out of the cursor's block."""
    line_prefix = request.line_prefix
    cursor_indent = _indent(line_prefix) if line_prefix.strip() else len(line_prefix)
    opens_block = line_prefix.rstrip().endswith(":")
    block_indent: int | None = None if opens_block else cursor_indent
    starts = _line_starts(text)
    # Only whole lines are judged: the last line may still be growing its indentation.
    for index, start in enumerate(starts[1:], start=1):
        end = starts[index + 1] - 1 if index + 1 < len(starts) else None
        if end is None:
            break
        line = text[start:end]
        if not line.strip():
            continue
        indent = _indent(line)
        if block_indent is None:
            # The cursor line opens a block: the block is as deep as its first body line.
            if indent <= _indent(line_prefix):
                return _cut_at_line(text, start)
            block_indent = indent
            continue
        if indent < block_indent:
            return _cut_at_line(text, start)
    return None


def _scan_brackets(text: str) -> list[tuple[int, int]]:
    """(offset, depth after it) for each bracket outside strings and line comments."""
    events: list[tuple[int, int]] = []
    depth = 0
    quote = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote or (ch == "\n" and quote != "`"):
                quote = ""
        elif ch in _QUOTES:
            quote = ch
        elif text.startswith("//", i):
            newline = text.find("\n", i)
            if newline < 0:
                break
            i = newline
            continue
        elif ch in _OPENERS:
            depth += 1
            events.append((i, depth))
        elif ch in _CLOSERS:
            depth -= 1
            events.append((i, depth))
        i += 1
    return events


def _first_code_line(text: str) -> str:
    for line in text.split("\n"):
        if line.strip():
            return line.strip()
    return ""


def _brace_stop(text: str, request: CompletionRequest) -> int | None:
    """Cut where a later line of the suggestion closes a bracket opened before the suggestion.

    Closers on the suggestion's first line finish the statement the user is typing
    (`foo(` + `1, 2);`), so the level the block must not drop below is taken at that line's end.
    """
    first_newline = text.find("\n")
    if first_newline < 0:
        return None
    opened_on_cursor_line = request.line_prefix.rstrip().endswith(tuple(_OPENERS))
    # When the cursor line opens a block that nothing after the cursor closes yet, the suggestion
    # may close it; otherwise the closer is already in the suffix and must not be repeated.
    next_suffix_line = _first_code_line(request.suffix[len(request.line_suffix) :])
    may_close_own = opened_on_cursor_line and not next_suffix_line.startswith(tuple(_CLOSERS))
    events = _scan_brackets(text)
    on_first_line = [depth for offset, depth in events if offset < first_newline]
    floor = min(0, on_first_line[-1]) if on_first_line else 0
    for offset, depth in events:
        if offset < first_newline or depth >= floor:
            continue
        line_start = text.rfind("\n", 0, offset) + 1
        if may_close_own and depth == floor - 1 and floor == 0:
            line_end = text.find("\n", offset)
            return line_end if line_end >= 0 else None
        if text[line_start:offset].strip():
            return offset
        return _cut_at_line(text, line_start)
    return None


def stop_rule(request: CompletionRequest, *, max_lines: int = DEFAULT_MAX_LINES) -> StopRule:
    """When to stop generating for this request.

    Code after the cursor on its line means the user wants that line finished: stop at the first
    newline. Otherwise stop where the suggestion leaves the enclosing block (a dedent below the
    block's indentation in indentation languages, a closing bracket below the starting level in
    brace languages), and after `max_lines` lines.
    """
    if request.line_suffix.strip():

        def single_line(text: str) -> int | None:
            newline = text.find("\n")
            return newline if newline >= 0 else None

        return single_line

    by_indentation = is_indented(request.language, request.path)

    def multi_line(text: str) -> int | None:
        cuts = [
            cut
            for cut in (
                _indentation_stop(text, request) if by_indentation else _brace_stop(text, request),
                _cap_lines(text, max_lines),
            )
            if cut is not None
        ]
        return min(cuts) if cuts else None

    return multi_line


# A unit repeated in a row. A decoder stuck in a loop repeats it up to where it was stopped, so
# only a run that reaches the end of its line counts.
_REPEAT = re.compile(r"(.{1,24}?)\1{5,}", re.DOTALL)
_CHAR_LOOP_MIN = 12
# Characters that legitimately repeat: rulers in comments, indentation, operators.
_RULER_CHARS = frozenset(" \t\n-=*#_~.+/\\|<>0")
_MAX_LINE_PERIOD = 4
_LINE_REPEATS = 3
_SHORT_OVERLAP_CHARS = 6


def _cut_line_loops(lines: list[str]) -> list[str]:
    """Keep one copy of a block of lines that repeats itself at least `_LINE_REPEATS` times.

    Lines compare without their indentation: the first line of a suggestion continues the
    cursor's line and so carries none.
    """
    keys = [line.strip() for line in lines]
    for start in range(len(keys)):
        for period in range(1, _MAX_LINE_PERIOD + 1):
            block = keys[start : start + period]
            if len(block) < period or not any(block):
                continue
            repeats = 1
            while keys[start + repeats * period : start + (repeats + 1) * period] == block:
                repeats += 1
            # The copy cut short by the stop counts: the loop was still going.
            tail = keys[start + repeats * period : start + (repeats + 1) * period]
            partial = bool(tail) and block[: len(tail)] == tail
            if repeats + partial >= _LINE_REPEATS:
                return lines[: start + period]
    return lines


def _cut_token_loop(text: str) -> str:
    """Cut a run of a repeated unit at the end of a line down to one copy of the unit."""
    for match in _REPEAT.finditer(text):
        unit = match.group(1)
        line_end = text.find("\n", match.end())
        rest = text[match.end() : line_end if line_end >= 0 else len(text)]
        if len(rest) >= len(unit) or not unit.startswith(rest):
            continue
        if len(set(unit)) == 1:
            if unit[0] in _RULER_CHARS or match.end() - match.start() < _CHAR_LOOP_MIN:
                continue
            unit = unit[0]
        return text[: match.start() + len(unit)]
    return text


def _unmatched(text: str) -> int:
    """Closers without an opener plus unpaired quotes: a sign of text borrowed from the suffix."""
    depth = {k: 0 for k in _OPENERS}
    unmatched = 0
    for ch in text:
        if ch in _OPENERS:
            depth[ch] += 1
        elif ch in _CLOSERS:
            if depth[_CLOSERS[ch]]:
                depth[_CLOSERS[ch]] -= 1
            else:
                unmatched += 1
    return unmatched + sum(text.count(q) % 2 for q in _QUOTES)


def _strip_suffix_overlap(text: str, suffix: str) -> str:
    """Remove the end of `text` that the suffix already starts with."""
    for size in range(min(len(text), len(suffix)), 0, -1):
        overlap = suffix[:size]
        if not text.endswith(overlap):
            continue
        kept = text[:-size]
        # A long overlap is repetition; a short one (`)`, `":`) only when dropping it balances
        # the suggestion, so `f(x)` before a suffix `)` keeps its own parenthesis.
        long_enough = len(overlap.strip()) >= _SHORT_OVERLAP_CHARS
        if long_enough or _unmatched(kept) < _unmatched(text):
            return kept
    return text


def _strip_repeated_suffix_lines(text: str, suffix: str) -> str:
    """Drop trailing suggestion lines that the lines after the cursor already contain."""
    lines = text.split("\n")
    following = [line.strip() for line in suffix.split("\n")[1:] if line.strip()]
    for count in range(min(len(lines) - 1, len(following)), 0, -1):
        tail = [line.strip() for line in lines[-count:]]
        if tail == following[:count] and sum(len(line) for line in tail) >= _SHORT_OVERLAP_CHARS:
            return "\n".join(lines[:-count])
    return text


def _repeats_suffix(text: str, request: CompletionRequest) -> bool:
    body = text.strip()
    if not body:
        return True
    suffix = request.suffix
    return suffix.startswith(text) or suffix.lstrip().startswith(body)


def clean(text: str, request: CompletionRequest, min_chars: int) -> str:
    """The suggestion as it should be shown, or "" when it is not worth showing.

    Applies the request's stop rule again (runners that stream may overshoot), drops repetition
    loops, text that only repeats what follows the cursor, trailing whitespace and blank lines,
    and anything with fewer than `min_chars` non-blank characters.
    """
    return clean_with_reason(text, request, min_chars)[0]


EMPTY_FROM_MODEL = "the model wrote nothing before a stop"
REPEATS_SUFFIX = "it only repeats the code after the cursor"
TOO_SHORT = "fewer non-blank characters than completion.minChars"
# Set by the engine after the syntax check in place (`completion.syntax`), not by `clean`.
SYNTAX_DROPPED = "the suggestion broke code that parsed"


def clean_with_reason(text: str, request: CompletionRequest, min_chars: int) -> tuple[str, str]:
    """`clean`'s suggestion, and why it is empty when it is (one of the constants above)."""
    cut = stop_rule(request)(text)
    if cut is not None:
        text = text[:cut]
    text = _cut_token_loop(text)
    lines = _cut_line_loops([line.rstrip() for line in text.split("\n")])
    text = "\n".join(lines).rstrip()
    if not text:
        return "", EMPTY_FROM_MODEL
    if _repeats_suffix(text, request):
        return "", REPEATS_SUFFIX
    text = _strip_repeated_suffix_lines(text, request.suffix).rstrip()
    text = _strip_suffix_overlap(text, request.suffix).rstrip()
    if _repeats_suffix(text, request):
        return "", REPEATS_SUFFIX
    if sum(not ch.isspace() for ch in text) < min_chars:
        return "", TOO_SHORT
    return text, ""
