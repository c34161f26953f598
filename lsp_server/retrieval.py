"""Snippets from the rest of the workspace for the completion engine.

Three sources, in this order of preference, each skipped once the deadline passes:

1. definitions of names used near the cursor (from the index's symbol table);
2. chunks close in meaning to the code around the cursor (the semantic index), leaving out the
   cursor's own chunk and chunks of the same file near the cursor (the prefix has those);
3. recently edited ranges of other open documents.

The snippets chosen for a cursor line are kept while the user types on that line, so the start
of the prompt stays the same from one keystroke to the next and the model's KV cache matches.
"""

from __future__ import annotations

import keyword
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from completion.types import CompletionRequest, Snippet
from lsp_server.documents import DocumentChange, DocumentListener

if TYPE_CHECKING:
    from indexer.service import WorkspaceIndex

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
QUERY_LINES_BEFORE = 12
QUERY_LINES_AFTER = 4
NEAR_LINES = 40  # chunks of the cursor's file this close are already in the prompt
SEARCH_K = 8
DEFINITIONS_MAX = 3
DEFINITION_CANDIDATES = 4  # symbols looked at per name (exact matches come first)
RECENT_KEPT = 16
RECENT_CONTEXT_LINES = 3
COMMON_NAMES = frozenset(dir(__builtins__)) | frozenset(keyword.kwlist) | {"self", "cls"}


@dataclass(frozen=True)
class RecentEdit:
    uri: str
    line: int
    at: float


class RecentEdits(DocumentListener):
    """Where the user edited lately, per document (a document listener)."""

    def __init__(self) -> None:
        self._edits: OrderedDict[tuple[str, int], RecentEdit] = OrderedDict()
        self._lock = threading.Lock()

    def did_change(self, change: DocumentChange) -> None:
        now, uri = time.monotonic(), change.uri
        with self._lock:
            for edit in change.edits:
                if not edit.whole:
                    key = (uri, edit.line)
                    self._edits.pop(key, None)
                    self._edits[key] = RecentEdit(uri, edit.line, now)
            while len(self._edits) > RECENT_KEPT:
                self._edits.popitem(last=False)

    def did_close(self, uri: str) -> None:
        with self._lock:
            for key in [k for k in self._edits if k[0] == uri]:
                del self._edits[key]

    def latest(self, exclude_uri: str) -> list[RecentEdit]:
        """Most recent first, one per region of a few lines."""
        with self._lock:
            edits = [e for e in reversed(self._edits.values()) if e.uri != exclude_uri]
        kept: list[RecentEdit] = []
        for edit in edits:
            if all(
                edit.uri != k.uri or abs(edit.line - k.line) > 2 * RECENT_CONTEXT_LINES
                for k in kept
            ):
                kept.append(edit)
        return kept


def query_text(request: CompletionRequest) -> str:
    """The code around the cursor, as a search query."""
    before = request.prefix.splitlines()[-QUERY_LINES_BEFORE:]
    after = request.suffix.splitlines()[:QUERY_LINES_AFTER]
    return "\n".join(before + after)


def names_near_cursor(request: CompletionRequest, lines: int = 6) -> list[str]:
    """Identifiers used just before the cursor, nearest first, without builtins and keywords."""
    text = "\n".join(request.prefix.splitlines()[-lines:])
    seen: list[str] = []
    for name in reversed(IDENTIFIER.findall(text)):
        if name not in COMMON_NAMES and name not in seen:
            seen.append(name)
    return seen


class WorkspaceContext:
    """A `completion.context.ContextSource` over the workspace index and open documents."""

    def __init__(
        self,
        index: Callable[[], WorkspaceIndex | None],
        document_text: Callable[[str], str | None],
        root: Callable[[], Path | None],
    ) -> None:
        self._index = index
        self._document_text = document_text
        self._root = root
        self.recent = RecentEdits()
        self._last: tuple[str, int, list[Snippet]] | None = None
        self._lock = threading.Lock()

    @property
    def repo_name(self) -> str:
        """The workspace's name, as repository-level prompts show it (`completion.fim`)."""
        root = self._root()
        return root.name if root is not None else ""

    def snippets(self, request: CompletionRequest, deadline: float) -> Sequence[Snippet]:
        with self._lock:
            last = self._last
        if last is not None and last[0] == request.uri and last[1] == request.line:
            return last[2]
        found = self._gather(request, deadline)
        with self._lock:
            self._last = (request.uri, request.line, found)
        return found

    def _relative(self, path: str | None) -> str | None:
        root = self._root()
        if path is None:
            return None
        if root is None:
            return path
        try:
            return Path(path).resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            return path

    def _gather(self, request: CompletionRequest, deadline: float) -> list[Snippet]:
        index = self._index()
        snippets: list[Snippet] = []
        own_path = self._relative(request.path)
        if index is not None:
            snippets.extend(self._definitions(index, request, own_path, deadline))
            if time.monotonic() < deadline:
                snippets.extend(self._similar(index, request, own_path))
        if time.monotonic() < deadline:
            snippets.extend(self._recent(request))
        return snippets

    def _near_cursor(
        self, request: CompletionRequest, own_path: str | None, path: str, start: int, end: int
    ) -> bool:
        if path != own_path:
            return False
        return start - NEAR_LINES <= request.line < end + NEAR_LINES

    def _definitions(
        self,
        index: WorkspaceIndex,
        request: CompletionRequest,
        own_path: str | None,
        deadline: float,
    ) -> list[Snippet]:
        found: list[Snippet] = []
        for name in names_near_cursor(request):
            if len(found) >= DEFINITIONS_MAX or time.monotonic() >= deadline:
                break
            # A name lookup: embedding every name would cost more than the whole search.
            for symbol in index.symbols(name, k=DEFINITION_CANDIDATES, by_meaning=False):
                if symbol.name != name:
                    continue
                chunk = index.chunk_at(symbol.path, symbol.line)
                if chunk is None or self._near_cursor(
                    request, own_path, symbol.path, chunk.start_line, chunk.end_line
                ):
                    continue
                found.append(Snippet(chunk.path, chunk.text, 1.0, "definition"))
                break
        return found

    def _similar(
        self, index: WorkspaceIndex, request: CompletionRequest, own_path: str | None
    ) -> list[Snippet]:
        found = []
        for hit in index.search(query_text(request), k=SEARCH_K):
            if self._near_cursor(request, own_path, hit.path, hit.start_line, hit.end_line):
                continue  # the cursor's own chunk, or code the prefix already holds
            found.append(Snippet(hit.path, hit.text or hit.preview, hit.score, "index"))
        return found

    def _recent(self, request: CompletionRequest) -> list[Snippet]:
        found = []
        for edit in self.recent.latest(exclude_uri=request.uri)[:3]:
            text = self._document_text(edit.uri)
            if not text:
                continue
            lines = text.splitlines()
            start = max(0, edit.line - RECENT_CONTEXT_LINES)
            piece = "\n".join(lines[start : edit.line + RECENT_CONTEXT_LINES + 1])
            path = self._relative(_uri_path(edit.uri)) or edit.uri
            found.append(Snippet(path, piece, 0.5, "recent"))
        return found

    def status_parts(self) -> dict[str, Any]:
        """The `context` part of `tabloop/status`."""
        return {"context": {"recentEdits": len(self.recent.latest(exclude_uri=""))}}


def _uri_path(uri: str) -> str | None:
    from pygls.uris import to_fs_path

    return to_fs_path(uri)
