"""Pieces of the replay simulator: cursor positions in real files and a simulated user.

The simulated user edits a file that is already written, as in an editor: at a sampled position
the rest of the cursor's line is missing (the *hole*) and everything after it is there (the
*suffix*). Brackets the line opened before the cursor and closes at its end stand after the
cursor already, as an editor's auto-closing puts them, so such a request has code after the
cursor on its line and gets the single-line stop rule. The user accepts a suggestion when it says
what the hole really says, takes a prefix of it when at least `min_partial_chars` of it are
right, and otherwise ignores it. Accepted text survives (is retained) as far as it matches.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from common.languages import request_language
from completion.types import CompletionRequest
from evaluation.positions import Draw, TypingPauses, read_sources, sample_cursors, select_files

# The corpus: files of these kinds (their language ids come from `common.languages`).
CORPUS_SUFFIXES = (".py", ".js", ".ts", ".go")
MAX_FILE_BYTES = 200_000


@dataclass(frozen=True)
class Position:
    """A cursor position in a real file: what was typed before it, and the truth after it."""

    path: str
    prefix: str
    truth: str  # the rest of the file, as it was really written: hole + suffix
    line: int
    character: int

    @property
    def language(self) -> str:
        """The LSP id of the file, as the server gives a file no editor named."""
        return request_language(None, self.path)

    @property
    def suffix(self) -> str:
        """The code after the cursor that is already there (the auto-closed brackets, if any,
        then the next line break and the rest of the file)."""
        return self.truth[hole_length(self.prefix, self.truth) :]

    @property
    def hole(self) -> str:
        """What the user is about to type: the rest of the line before its auto-closed tail."""
        return self.truth[: hole_length(self.prefix, self.truth)]

    def request(self) -> CompletionRequest:
        return CompletionRequest(
            prefix=self.prefix,
            suffix=self.suffix,
            language=self.language,
            path=self.path,
            uri=Path(self.path).as_uri(),
            trigger="automatic",
            line=self.line,
            character=self.character,
        )


_PAIRS = {"(": ")", "[": "]", "{": "}"}


def hole_length(prefix: str, truth: str) -> int:
    """Length of the hole at the start of `truth`: the rest of the cursor's line, less the run of
    closing brackets at its end that close brackets opened on the line before the cursor (the
    editor inserted those when they were opened). The hole is never empty: when nothing but
    closers would be left, the whole rest of the line is the hole."""
    line_end = truth.find("\n")
    rest = truth if line_end < 0 else truth[:line_end]
    code = rest.rstrip()
    open_stack: list[str] = []
    for ch in prefix[prefix.rfind("\n") + 1 :]:
        if ch in _PAIRS:
            open_stack.append(_PAIRS[ch])
        elif open_stack and ch == open_stack[-1]:
            open_stack.pop()
    closed = 0
    while open_stack and code[: len(code) - closed].endswith(open_stack[-1]):
        closed += 1
        open_stack.pop()
    hole = len(code) - closed
    return hole if code[:hole].strip() else len(rest)


def corpus_files(root: Path) -> list[Path]:
    """Source files under `root` (sorted, tests and huge files left out)."""
    return select_files(root, CORPUS_SUFFIXES, MAX_FILE_BYTES, skip_tests=True)


def sample_positions(
    root: Path, count: int, seed: int, keep: Callable[[str], bool] | None = None
) -> list[Position]:
    """`count` positions spread over the files under `root` (those whose path relative to it
    `keep` accepts, when given), the same for the same seed, in file and offset order.

    A position is where a typist pauses (`evaluation.positions.TypingPauses`).
    """
    files = corpus_files(root)
    if keep is not None:
        files = [f for f in files if keep(f.relative_to(root).as_posix())]
    cursors = sample_cursors(
        read_sources(files),
        count,
        random.Random(seed),
        TypingPauses(),
        Draw.PLACE_THEN_SAMPLE,
    )
    cursors.sort(key=lambda c: (str(c.source.path), c.offset))
    positions = []
    for cursor in cursors:
        text, offset = cursor.source.text, cursor.offset
        positions.append(
            Position(
                path=str(cursor.source.path),
                prefix=text[:offset],
                truth=text[offset:],
                line=cursor.line.number,
                character=cursor.column,
            )
        )
    return positions


@dataclass(frozen=True)
class UserResponse:
    """What the simulated user did with a shown suggestion."""

    kind: Literal["accepted", "partial", "ignored"]
    accepted_chars: int
    retained_chars: int


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def simulated_user(suggestion: str, truth: str, min_partial_chars: int = 4) -> UserResponse:
    """Accept what matches the truth, take a right prefix of at least a few characters, else
    ignore.

    A multi-line suggestion whose first line is right is accepted whole (the user sees the line
    they meant to type); what it gets wrong after that is deleted, so only the matching part is
    retained.
    """
    matching = _common_prefix(suggestion, truth)
    if matching == len(suggestion):
        return UserResponse("accepted", len(suggestion), len(suggestion))
    first_line = suggestion.split("\n", 1)[0]
    if "\n" in suggestion and first_line.strip() and matching > len(first_line):
        return UserResponse("accepted", len(suggestion), matching)
    if len(suggestion[:matching].strip()) >= min_partial_chars:
        return UserResponse("partial", matching, matching)
    return UserResponse("ignored", 0, 0)
