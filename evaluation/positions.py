"""Cursor positions in real files: which files, where in them a cursor may sit, and a seeded draw.

Every evaluation that asks for completions at sampled places in real code (the demo, `eval holes`,
the replay and the gate bench) samples them here. Three things vary between them, and each is a
parameter rather than a copy of the loop:

- which files: `select_files` (extensions, a size limit, test files left out or not);
- where a cursor may sit in a file: a `CursorRule` (`FunctionStatements` for the demo,
  `LineOrBlock` for `eval holes`, `TypingPauses` for the replay);
- the order in which the seeded RNG is consumed: a `Draw`.

The draw order is part of the contract, not an implementation detail: committed results and
cached model outputs are keyed on the sampled positions, so each caller must sample exactly the
same positions for the same seed as it always has (tests/evaluation/test_positions.py holds
fingerprints of them on real standard-library files).
"""

from __future__ import annotations

import ast
import enum
import random
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Literal, Protocol


def select_files(
    root: Path, suffixes: Collection[str], max_bytes: int, *, skip_tests: bool = False
) -> list[Path]:
    """Files under `root` with one of `suffixes` and at most `max_bytes`, sorted by path.

    `skip_tests` leaves out files with `test` in their name: a suite's tests repeat the code
    they test, which would let a model copy its answer from elsewhere in the corpus.
    """
    return sorted(
        path
        for path in root.rglob("*")
        if path.suffix in suffixes
        and path.is_file()
        and path.stat().st_size <= max_bytes
        and not (skip_tests and "test" in path.name)
    )


@dataclass(frozen=True)
class SourceFile:
    """A file's text, read once and shared by the rule and the caller."""

    path: Path
    text: str

    @cached_property
    def lines(self) -> list[str]:
        """The lines, each with its line break (`str.splitlines(keepends=True)`)."""
        return self.text.splitlines(keepends=True)

    @cached_property
    def line_starts(self) -> list[int]:
        """The offset in `text` of each of `lines`."""
        starts, offset = [], 0
        for line in self.lines:
            starts.append(offset)
            offset += len(line)
        return starts


def read_sources(paths: Iterable[Path]) -> list[SourceFile]:
    """The files that can be read as UTF-8, in the given order; the others are left out."""
    sources = []
    for path in paths:
        try:
            sources.append(SourceFile(path, path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError):
            continue
    return sources


@dataclass(frozen=True)
class Line:
    """A line where a cursor may sit, as the rule that found it splits its file."""

    number: int  # 0-based
    start: int  # offset of its first character in the file's text
    text: str


@dataclass(frozen=True)
class Cursor:
    """A sampled cursor: where it is, and (`kind`) what the caller should hide after it."""

    source: SourceFile
    line: Line
    column: int
    kind: Literal["line", "block"] = "line"

    @property
    def offset(self) -> int:
        return self.line.start + self.column


class CursorRule(Protocol):
    """Where in one file a cursor may sit."""

    def candidates(self, source: SourceFile) -> list[Line]:
        """The lines a cursor may sit on, in the order the draw sees them."""
        ...

    def place(self, source: SourceFile, line: Line, rng: random.Random) -> Cursor | None:
        """Where on `line` the cursor sits (None: nowhere on this line)."""
        ...


class Draw(enum.Enum):
    """In which order the seeded RNG is consumed (and so which positions a seed gives)."""

    PLACE_THEN_SAMPLE = "place-then-sample"
    """Every candidate line of every file is placed (one RNG call each, in file order), then
    `count` cursors are drawn from all of them."""
    SAMPLE_THEN_PLACE = "sample-then-place"
    """`count` lines are drawn from all files' candidates, then each is placed in draw order."""
    PER_FILE = "per-file"
    """In each file in turn, its candidate lines are shuffled and the first `count` that take a
    cursor are kept: `count` per file, not in all."""


def sample_cursors(
    sources: Sequence[SourceFile], count: int, rng: random.Random, rule: CursorRule, draw: Draw
) -> list[Cursor]:
    """Cursors in `sources` where `rule` allows them, drawn with `rng` in the order `draw` says."""
    if draw is Draw.PER_FILE:
        cursors: list[Cursor] = []
        for source in sources:
            lines = rule.candidates(source)
            rng.shuffle(lines)
            taken = 0
            for line in lines:
                if taken == count:
                    break
                cursor = rule.place(source, line, rng)
                if cursor is not None:
                    cursors.append(cursor)
                    taken += 1
        return cursors
    if draw is Draw.PLACE_THEN_SAMPLE:
        placed = [
            cursor
            for source in sources
            for line in rule.candidates(source)
            if (cursor := rule.place(source, line, rng)) is not None
        ]
        return rng.sample(placed, min(count, len(placed)))
    pool = [(source, line) for source in sources for line in rule.candidates(source)]
    chosen = rng.sample(pool, min(count, len(pool)))
    return [
        cursor for source, line in chosen if (cursor := rule.place(source, line, rng)) is not None
    ]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


@dataclass(frozen=True)
class TypingPauses:
    """Where a typist pauses: at the start of a line's code (after its indent) or after a space
    or punctuation inside it; never on a blank or comment line, nor in a file's first lines.

    Lines are split on `\\n` only, and their text keeps any `\\r`.
    """

    skip_lines: int = 4
    pause_after: str = " (.,=[:"

    def candidates(self, source: SourceFile) -> list[Line]:
        lines, offset = [], 0
        for number, text in enumerate(source.text.split("\n")):
            stripped = text.strip()
            if stripped and not stripped.startswith("#") and number >= self.skip_lines:
                lines.append(Line(number, offset, text))
            offset += len(text) + 1
        return lines

    def place(self, source: SourceFile, line: Line, rng: random.Random) -> Cursor:
        text = line.text
        indent = _indent(text)
        stops = [indent] + [
            i + 1 for i in range(indent, len(text) - 1) if text[i] in self.pause_after
        ]
        return Cursor(source, line, rng.choice(stops))


@dataclass(frozen=True)
class LineOrBlock:
    """Any line of code (not a comment or docstring line, at least `min_chars` long), part-way
    into it; or, for a share of indented lines, at its indent with the rest of its block hidden.

    `Line.text` keeps its line break. On a line, the column is drawn from the first half of the
    code after the indent.
    """

    block_share: float = 0.25
    min_chars: int = 8
    comment_starts: tuple[str, ...] = ("#", '"', "'", "//", "*")

    def candidates(self, source: SourceFile) -> list[Line]:
        return [
            Line(number, start, text)
            for number, (start, text) in enumerate(
                zip(source.line_starts, source.lines, strict=True)
            )
            if len(stripped := text.strip()) >= self.min_chars
            and not stripped.startswith(self.comment_starts)
        ]

    def place(self, source: SourceFile, line: Line, rng: random.Random) -> Cursor:
        indent = _indent(line.text)
        indented = indent > 0 and line.number + 1 < len(source.lines)
        if indented and rng.random() < self.block_share:
            return Cursor(source, line, indent, "block")
        content = line.text.rstrip("\r\n")
        column = indent + rng.randrange(0, max(1, (len(content) - indent) // 2 + 1))
        return Cursor(source, line, column)


@dataclass(frozen=True)
class FunctionStatements:
    """Python statements (assignments, returns, expressions, `if`) directly in a function body,
    after its docstring: a cursor a few characters into one, where a person is part-way through
    typing it. Short lines and comment or string lines take no cursor.

    `Line.text` is the line without its line break.
    """

    min_chars: int = 12
    typed_chars: int = 12

    def candidates(self, source: SourceFile) -> list[Line]:
        texts = source.text.splitlines()
        numbers = []
        for node in ast.walk(ast.parse(source.text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for statement in node.body[1:] if ast.get_docstring(node) else node.body:
                    if isinstance(statement, ast.Assign | ast.Return | ast.Expr | ast.If):
                        numbers.append(statement.lineno - 1)
        return [Line(n, source.line_starts[n], texts[n]) for n in numbers]

    def place(self, source: SourceFile, line: Line, rng: random.Random) -> Cursor | None:
        stripped = line.text.lstrip()
        if len(stripped) < self.min_chars or stripped.startswith(("#", '"', "'")):
            return None
        indent = len(line.text) - len(stripped)
        return Cursor(source, line, indent + min(len(stripped) // 3, self.typed_chars))
