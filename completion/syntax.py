"""The syntax check in place: does the file still parse where the suggestion goes?

The file is parsed with tree-sitter as it is (prefix + suffix) and again with the suggestion
inserted, incrementally from the first tree (only the edited region is re-parsed). A suggestion
*introduces an error* when the second tree has an error (a missing node, or an error node that
skipped tokens) starting on a line where the first had none (lines after the insertion are
compared with the same lines before it; lines of the suggestion with the cursor's line). Such a
suggestion is cut to its longest start, at a line break, that introduces none, or dropped when
no start is left.

A line that was already broken at the cursor (the user is mid-statement) is no reason to drop a
suggestion: only errors where the original text parsed count.

The first tree is not built from nothing on every keystroke: the checker keeps, per document, the
text and tree of its last check, finds the one range where the new text differs from it (common
start and end) and re-parses only that range. Typing a character costs an incremental parse, not a
parse of the whole file.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from common import grammars
from common.languages import BY_ID
from common.sequences import common_end, common_start
from completion.types import CompletionRequest

Outcome = Literal["kept", "cut", "dropped", "unchecked"]
# Files beyond this size are not checked: the first parse would cost more than a keystroke's time.
MAX_CHECK_BYTES = 1_000_000
# Documents whose last tree is kept, per thread (the most recently checked ones).
KEPT_TREES = 8


@dataclass(frozen=True)
class SyntaxVerdict:
    """The suggestion after the check, what the check did, and how long it took."""

    text: str
    outcome: Outcome
    ms: float = 0.0
    parses: int = 0  # trees built (the first one in full or from the document's last tree)
    reused: bool = False  # the first tree came from the document's last one


def grammar_for(language: str) -> str | None:
    """The tree-sitter grammar of an LSP language id (or of a grammar name), if one is bundled."""
    known = BY_ID.get(language)
    name = known.grammar if known is not None else language
    return name if name in grammars.WHEELS else None


def _error_rows(root: Any) -> set[int]:
    """Rows where errors start: MISSING nodes, and ERROR nodes that skipped tokens.

    An ERROR node that holds only whole constructs is error recovery wrapping the code around
    an error (it may start many lines above it): its start is not where anything is wrong, so
    only the errors inside it count. Only subtrees that hold an error are walked.
    """
    rows: set[int] = set()
    if not root.has_error:
        return rows
    stack = [root]
    while stack:
        node = stack.pop()
        if node.is_missing:
            rows.add(node.start_point[0])
            continue
        if node.is_error and (
            not node.children or any(child.child_count == 0 for child in node.children)
        ):
            rows.add(node.start_point[0])
        stack.extend(child for child in node.children if child.has_error or child.is_missing)
    return rows


def _line_starts(text: str) -> Iterator[int]:
    """Lengths of the starts of `text` that end just before a line break, longest first."""
    end = len(text)
    while True:
        end = text.rfind("\n", 0, end)
        if end <= 0:
            return
        yield end


def _point(text: bytes, offset: int) -> tuple[int, int]:
    """Tree-sitter's (row, byte column) of `offset` in `text`."""
    return text.count(b"\n", 0, offset), offset - (text.rfind(b"\n", 0, offset) + 1)


@dataclass
class _Kept:
    grammar: str
    text: bytes
    tree: Any


class SyntaxChecker:
    """Checks suggestions with one parser per grammar (parsers are not shared between threads)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def _kept(self) -> OrderedDict[str, _Kept]:
        kept: OrderedDict[str, _Kept] = self._local.__dict__.setdefault("kept", OrderedDict())
        return kept

    def _tree(self, document: str, grammar: str, text: bytes) -> tuple[Any, bool]:
        """The tree of `text`, re-parsed from the document's last tree where there is one."""
        parser = self._parser(grammar)
        kept = self._kept()
        last = kept.get(document) if document else None
        reused = last is not None and last.grammar == grammar
        if last is None or last.grammar != grammar:
            tree = parser.parse(text)
        elif last.text == text:
            tree = last.tree
        else:
            start = common_start(last.text, text)
            end = common_end(last.text, text, start)
            old_end, new_end = len(last.text) - end, len(text) - end
            edited = last.tree.copy()
            edited.edit(
                start_byte=start,
                old_end_byte=old_end,
                new_end_byte=new_end,
                start_point=_point(text, start),
                old_end_point=_point(last.text, old_end),
                new_end_point=_point(text, new_end),
            )
            tree = parser.parse(text, edited)
        if document:
            kept[document] = _Kept(grammar, text, tree)
            kept.move_to_end(document)
            while len(kept) > KEPT_TREES:
                kept.popitem(last=False)
        return tree, reused

    def _parser(self, grammar: str) -> Any:
        parsers: dict[str, Any] = self._local.__dict__.setdefault("parsers", {})
        parser = parsers.get(grammar)
        if parser is None:
            parser = parsers[grammar] = grammars.parser_for(grammar)
        return parser

    def check(self, request: CompletionRequest, suggestion: str) -> SyntaxVerdict:
        """`suggestion` as it may be shown at `request`'s cursor (see the module's description)."""
        started = time.perf_counter()
        grammar = grammar_for(request.language)
        if not suggestion.strip() or grammar is None:
            return SyntaxVerdict(suggestion, "unchecked")
        head = request.prefix.encode("utf-8", "surrogatepass")
        tail = request.suffix.encode("utf-8", "surrogatepass")
        if len(head) + len(tail) > MAX_CHECK_BYTES:
            return SyntaxVerdict(suggestion, "unchecked")
        parser = self._parser(grammar)
        original, reused = self._tree(request.uri or request.path or "", grammar, head + tail)
        before = _error_rows(original.root_node)
        row = request.prefix.count("\n")
        column = len(head) - (head.rfind(b"\n") + 1)
        parses = 1
        candidates = [suggestion, *(suggestion[:end] for end in _line_starts(suggestion))]
        for text in candidates:
            if not text.strip():
                continue
            inserted = text.encode("utf-8", "surrogatepass")
            lines = text.count("\n")
            end_column = (
                column + len(inserted) if not lines else len(inserted) - (inserted.rfind(b"\n") + 1)
            )
            edited = original.copy()
            edited.edit(
                start_byte=len(head),
                old_end_byte=len(head),
                new_end_byte=len(head) + len(inserted),
                start_point=(row, column),
                old_end_point=(row, column),
                new_end_point=(row + lines, end_column),
            )
            tree = parser.parse(head + inserted + tail, edited)
            parses += 1
            after = {
                r if r <= row else (row if r <= row + lines else r - lines)
                for r in _error_rows(tree.root_node)
            }
            if after <= before:
                outcome: Outcome = "kept" if text == suggestion else "cut"
                ms = (time.perf_counter() - started) * 1000
                return SyntaxVerdict(text, outcome, ms, parses, reused)
        ms = (time.perf_counter() - started) * 1000
        return SyntaxVerdict("", "dropped", ms, parses, reused)
