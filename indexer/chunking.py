"""Cutting files into chunks that follow definitions and fit the embedding model.

With a tree-sitter grammar, a file is tiled into segments, one per top-level syntax node (blank
lines go with the node after them). A segment over the token limit is tiled again from its
children (a class into its methods, a function into its statements), down to single lines, and a
single line still too long is cut at a token boundary. Segments are then packed in order: a
definition starts a new chunk once the current one holds `min_tokens`, small neighbours share a
chunk, no chunk exceeds `max_tokens`, and comments directly above a definition travel with it.
Files without a grammar are cut into windows of whole lines that share `overlap_lines`.

Chunks are whole lines (except pieces of one over-long line) and, for grammar files, tile the
file. Counting uses the embedding model's tokenizer when there is one (`WordPieceCounter`),
else a conservative estimate (`EstimatedCounter`).
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
from tokenizers import Tokenizer
from tree_sitter import Node, Parser

from indexer.languages import (
    GRAMMARS,
    Grammar,
    definition_kind,
    definition_name,
    language_of,
    parser_for,
)
from indexer.types import Chunk, Symbol

MAX_DEPTH = 64
_WRAPPERS = frozenset({"decorated_definition", "export_statement", "template_declaration"})
_SCOPES = frozenset({"class", "struct", "impl", "interface", "module", "namespace", "enum"})


class TokenCounter(Protocol):
    """Counts tokens the way the embedding model will see them (without special tokens)."""

    def count(self, texts: Sequence[str]) -> list[int]: ...

    def line_counts(self, lines: Sequence[str]) -> list[int]:
        """Tokens on each line of one text (tokens never span a newline)."""
        ...

    def pieces(self, text: str, max_tokens: int) -> list[str]:
        """`text` cut into consecutive pieces of at most `max_tokens` tokens each."""
        ...


class EstimatedCounter:
    """An upper-bound estimate for models without a tokenizer: every punctuation mark is a
    token, and a word of n letters is at most ceil(n / 3) word pieces."""

    _pieces = re.compile(r"[A-Za-z]+|\d+|[^\sA-Za-z\d]")

    def _estimate(self, text: str) -> int:
        total = 0
        for match in self._pieces.finditer(text):
            piece = match.group()
            total += math.ceil(len(piece) / 3) if piece[0].isalnum() else 1
        return total

    def count(self, texts: Sequence[str]) -> list[int]:
        return [self._estimate(text) for text in texts]

    def line_counts(self, lines: Sequence[str]) -> list[int]:
        return self.count(lines)

    def pieces(self, text: str, max_tokens: int) -> list[str]:
        starts = [0]
        used = 0
        for match in self._pieces.finditer(text):
            piece = match.group()
            cost = math.ceil(len(piece) / 3) if piece[0].isalnum() else 1
            if used + cost > max_tokens and match.start() > starts[-1]:
                starts.append(match.start())
                used = 0
            used += cost
        return _cut(text, starts)


class WordPieceCounter:
    """Exact counts from a Hugging Face fast tokenizer (`tokenizer.json`)."""

    def __init__(self, tokenizer: Path | Tokenizer) -> None:
        if isinstance(tokenizer, Path):
            tokenizer = Tokenizer.from_file(str(tokenizer))
        else:  # a copy: padding and truncation settings belong to the model's own tokenizer
            tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self._tokenizer = tokenizer
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def count(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [len(encoding.ids) for encoding in encodings]

    def line_counts(self, lines: Sequence[str]) -> list[int]:
        # One encoding of the whole text: far cheaper than one per line or per segment.
        starts = np.fromiter(itertools.accumulate(map(len, lines)), np.int64, len(lines))
        encoding = self._tokenizer.encode("".join(lines), add_special_tokens=False)
        begins = np.fromiter((begin for begin, _ in encoding.offsets), np.int64)
        rows = np.minimum(np.searchsorted(starts, begins, side="right"), len(lines) - 1)
        return [int(n) for n in np.bincount(rows, minlength=len(lines))]

    def pieces(self, text: str, max_tokens: int) -> list[str]:
        offsets = self._tokenizer.encode(text, add_special_tokens=False).offsets
        starts = [0] + [offsets[i][0] for i in range(max_tokens, len(offsets), max_tokens)]
        return _cut(text, starts)


def _cut(text: str, starts: list[int]) -> list[str]:
    bounds = [*starts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a]


@dataclass
class _Segment:
    start: int
    end: int
    nodes: list[Node] = field(default_factory=list)
    is_def: bool = False
    is_comment: bool = False
    tokens: int = 0
    continues: bool = False  # a later part of a split definition: packs with what precedes it


def split_lines(text: str) -> list[str]:
    """Lines as tree-sitter counts them (on `\\n` only), each with its newline."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


class Chunker:
    """Cuts files into `Chunk`s. Holds parsers, so use one per thread."""

    def __init__(
        self,
        counter: TokenCounter,
        *,
        max_tokens: int = 254,
        min_tokens: int = 48,
        overlap_lines: int = 3,
    ) -> None:
        if max_tokens < 8:
            raise ValueError("max_tokens must be at least 8")
        self.counter = counter
        self.max_tokens = max_tokens
        self.min_tokens = min(min_tokens, max_tokens)
        self.overlap_lines = overlap_lines
        self._parsers: dict[str, Parser | None] = {}
        self._prefix: list[int] = []  # tokens before each line of the file being chunked

    def chunk(self, path: str, text: str, language: str | None = None) -> list[Chunk]:
        """The chunks of one file's text (empty for a file with no text)."""
        language = language or language_of(path)
        lines = split_lines(text)
        if not lines or not text.strip():
            return []
        if language not in self._parsers:
            self._parsers[language] = parser_for(language)
        parser = self._parsers[language]
        self._prefix = list(itertools.accumulate(self.counter.line_counts(lines), initial=0))
        if parser is None:
            segments = self._fit(self._line_segments(0, len(lines)), lines, None, 0)
            return self._emit(path, language, lines, segments, [], self.overlap_lines)
        grammar = GRAMMARS[language]
        tree = parser.parse(text.encode("utf-8"))
        segments = self._tile(tree.root_node.children, 0, len(lines), grammar)
        segments = self._fit(segments, lines, grammar, 0)
        return self._emit(
            path, language, lines, segments, collect_symbols(tree.root_node, grammar), 0
        )

    def _tile(
        self, nodes: Sequence[Node], start: int, end: int, grammar: Grammar
    ) -> list[_Segment]:
        """Segments covering lines [start, end) exactly, one per group of nodes sharing rows."""
        groups: list[_Segment] = []
        for node in nodes:
            first = node.start_point.row
            last = node.end_point.row + (
                1 if node.end_point.column or node.end_point.row == first else 0
            )
            first, last = max(first, start), min(last, end)
            if last <= first:
                continue
            is_def = node.type in grammar.definitions
            is_comment = "comment" in node.type
            if groups and first < groups[-1].end:
                group = groups[-1]
                group.end = max(group.end, last)
                group.nodes.append(node)
                group.is_def |= is_def
                group.is_comment &= is_comment
            else:
                groups.append(_Segment(first, last, [node], is_def, is_comment))
        if not groups:
            return [_Segment(start, end)]
        groups[0].start = start
        for before, after in itertools.pairwise(groups):
            before.end = after.start  # blank lines go with the node before them
        groups[-1].end = end
        return groups

    def _line_segments(self, start: int, end: int) -> list[_Segment]:
        return [_Segment(line, line + 1) for line in range(start, end)]

    def _fit(
        self, segments: list[_Segment], lines: list[str], grammar: Grammar | None, depth: int
    ) -> list[_Segment]:
        """Replace every segment over the limit by smaller ones, recursively."""
        prefix = self._prefix
        counts = [prefix[s.end] - prefix[s.start] for s in segments]
        fitted: list[_Segment] = []
        for segment, tokens in zip(segments, counts, strict=True):
            segment.tokens = tokens
            # Parts of a split definition are split finer, so that its header packs with the
            # start of its body instead of making a chunk of its own.
            limit = self.max_tokens if depth == 0 else self.max_tokens // 2
            if tokens <= limit or segment.end - segment.start <= 1:
                fitted.append(segment)
                continue
            children = [child for node in segment.nodes for child in node.children]
            parts: list[_Segment] = []
            if grammar is not None and children and depth < MAX_DEPTH:
                parts = self._tile(children, segment.start, segment.end, grammar)
                if len(parts) == 1 and parts[0].nodes == segment.nodes:
                    parts = []
            if not parts:
                parts = self._line_segments(segment.start, segment.end)
            parts = self._fit(parts, lines, grammar, depth + 1)
            parts[0].is_def |= segment.is_def  # a split definition still starts a chunk
            for part in parts[1:]:
                part.continues = segment.is_def or segment.continues
            parts[0].continues = segment.continues
            fitted.extend(parts)
        return fitted

    def _emit(
        self,
        path: str,
        language: str,
        lines: list[str],
        segments: list[_Segment],
        symbols: list[Symbol],
        overlap: int,
    ) -> list[Chunk]:
        ranges: list[tuple[int, int] | Chunk] = []
        current: list[_Segment] = []
        tokens = 0

        def flush() -> None:
            if current:
                ranges.append((current[0].start, current[-1].end))

        for segment in _attach_comments(segments, self.max_tokens):
            if segment.tokens > self.max_tokens:  # one line too long: cut it at token limits
                flush()
                current, tokens = [], 0
                ranges.extend(self._cut_line(path, language, lines, segment.start, symbols))
                continue
            has_def = any(s.is_def for s in current)
            if current and (
                tokens + segment.tokens > self.max_tokens
                or (
                    (segment.is_def or (has_def and not segment.continues))
                    and tokens >= self.min_tokens
                )
            ):
                flush()
                kept = current[-overlap:] if overlap else []
                kept_tokens = sum(s.tokens for s in kept)
                if kept_tokens + segment.tokens > self.max_tokens:
                    kept, kept_tokens = [], 0
                current, tokens = kept, kept_tokens
            current.append(segment)
            tokens += segment.tokens
        flush()
        chunks: list[Chunk] = []
        for item in ranges:
            if isinstance(item, Chunk):
                chunks.append(item)
                continue
            start, end = item
            text = "".join(lines[start:end])
            if not text.strip():
                continue
            defined = tuple(s for s in symbols if start <= s.line < end)
            chunks.append(Chunk(path, start, end, language, text, defined))
        return _dedupe_pieces(chunks)

    def _cut_line(
        self, path: str, language: str, lines: list[str], line: int, symbols: list[Symbol]
    ) -> list[Chunk]:
        defined = tuple(s for s in symbols if s.line == line)
        return [
            Chunk(path, line, line + 1, language, piece, defined)
            for piece in self.counter.pieces(lines[line], self.max_tokens)
            if piece.strip()
        ]


def _attach_comments(segments: list[_Segment], max_tokens: int) -> list[_Segment]:
    """Merge comments directly above a definition into it, so they start its chunk."""
    out: list[_Segment] = []
    run: list[_Segment] = []  # comments waiting for what follows them
    for segment in segments:
        if segment.is_comment and not segment.is_def:
            run.append(segment)
            continue
        if segment.is_def and run:
            tokens = sum(s.tokens for s in run) + segment.tokens
            if tokens <= max_tokens:
                merged = _Segment(run[0].start, segment.end, [], True, False, tokens)
                out.append(merged)
                run = []
                continue
        out.extend(run)
        run = []
        out.append(segment)
    out.extend(run)
    return out


def _dedupe_pieces(chunks: list[Chunk]) -> list[Chunk]:
    # Pieces of one line may repeat (a long run of one character); keep placements distinct.
    seen: set[tuple[str, int]] = set()
    out: list[Chunk] = []
    for chunk in chunks:
        key = (chunk.id, chunk.start_line)
        if key not in seen:
            seen.add(key)
            out.append(chunk)
    return out


def collect_symbols(root: Node, grammar: Grammar) -> list[Symbol]:
    """Definitions at the top level and inside classes, impls, namespaces (not inside bodies
    of functions), with the name of the enclosing scope."""
    found: list[Symbol] = []
    stack: list[tuple[Node, str, int]] = [(root, "", 0)]
    while stack:
        node, container, depth = stack.pop()
        if depth > MAX_DEPTH:
            continue
        for child in node.named_children:
            if child.type in _WRAPPERS:
                stack.append((child, container, depth + 1))
            elif child.type in grammar.definitions:
                name = definition_name(child)
                kind = definition_kind(grammar, child)
                if name is None:
                    continue
                if kind == "function" and container:
                    kind = "method"
                if kind != "impl":  # an impl block is a scope for its methods, not a symbol
                    found.append(Symbol(name, kind, child.start_point.row, container))
                if kind in _SCOPES:
                    stack.append((child, name, depth + 1))
            elif child.type in grammar.containers:
                stack.append((child, container, depth + 1))
    found.sort(key=lambda s: (s.line, s.name))
    return found
