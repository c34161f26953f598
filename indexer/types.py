"""The index's vocabulary: chunks of code, the symbols they define, search results."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


def chunk_id(text: str) -> str:
    """A chunk's id: the SHA-256 (hex) of its UTF-8 text. Equal text, equal id, one embedding."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Symbol:
    """A name a chunk defines: `kind` is `function`, `method`, `class`, `struct`, … ."""

    name: str
    kind: str
    line: int
    container: str = ""

    @property
    def qualified_name(self) -> str:
        return f"{self.container}.{self.name}" if self.container else self.name


@dataclass(frozen=True)
class Chunk:
    """A contiguous piece of one file, embedded as a unit.

    Lines are 0-based and half-open: the chunk holds lines `start_line` to `end_line - 1`.
    """

    path: str
    start_line: int
    end_line: int
    language: str
    text: str
    symbols: tuple[Symbol, ...] = ()
    id: str = field(default="")

    def __post_init__(self) -> None:
        if not self.id:
            object.__setattr__(self, "id", chunk_id(self.text))

    def contains(self, line: int) -> bool:
        return self.start_line <= line < self.end_line


@dataclass(frozen=True)
class SearchHit:
    """One search result: where it is, how close it is (cosine similarity), what it says."""

    path: str
    start_line: int
    end_line: int
    score: float
    preview: str
    symbols: tuple[str, ...] = ()
    chunk_id: str = ""
    language: str = ""
    text: str = ""


@dataclass(frozen=True)
class SymbolHit:
    """A symbol found by name or by meaning, for `workspace/symbol`."""

    name: str
    kind: str
    path: str
    line: int
    container: str = ""
    score: float = 0.0
