"""The text of open documents, as LSP counts lines and columns, edited in place.

pygls keeps each open document as one string, splits it with `str.splitlines` (which also breaks
at form feed, U+0085, U+2028 and other characters LSP does not count as line breaks) and rebuilds
the whole string for every change. `Document` keeps the text as a list of lines split only at
`\\n`, `\\r\\n` and `\\r`; a change rewrites the lines it touches, and the joined text and the line
offsets are rebuilt only when read, and only as far as needed.

pygls's workspace still owns the folders, the root and the negotiated position encoding, and its
own `didOpen`/`didChange`/`didClose` handling runs as before: `adopt` puts a `Document` in the
workspace in place of pygls's copy when a document opens, so the workspace applies each change
through `Document.apply_change` and there is one copy of the text. Readers ask `open_document`,
which answers None for a URI the editor has not opened (pygls would read the file from disk).

Applying a change also records it in code points (`TextChange`); the document feature hands the
changes of one `didChange` to every listener as one `DocumentChange`, so nobody reads the raw
LSP events again or keeps a copy of the text to convert them. Each change also says the whole
lines it replaced (`LineSplice`), from which `DocumentChange.lines_after_each` rebuilds the text
after each change of a notification; a whole-text change is also narrowed to the edit it makes
(`narrowed_change`: the old and new text's common start and end).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, islice

from lsprotocol import types
from pygls.workspace import TextDocument, Workspace
from pygls.workspace.position_codec import PositionCodec, ServerTextPosition

from common.sequences import common_end, common_start

# What `str.splitlines` breaks at besides `\n` and `\r`; LSP does not.
_OTHER_BREAKS = re.compile("[\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
_TERMINATED_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)")


def split_lines(text: str) -> list[str]:
    """`text` as LSP lines, each with its line break; the last line has none (it may be empty).

    There is always one line more than there are line breaks, so a position's line number
    indexes the list directly, and `"".join(split_lines(text)) == text`.
    """
    if _OTHER_BREAKS.search(text) is None:
        lines = text.splitlines(keepends=True)  # C speed; the same answer without those breaks
        if not lines or lines[-1].endswith(("\n", "\r")):
            lines.append("")
        return lines
    lines = _TERMINATED_LINE.findall(text)
    lines.append(text[sum(map(len, lines)) :])
    return lines


def content_length(line: str) -> int:
    """The length of `line` without its line break."""
    if line.endswith("\r\n"):
        return len(line) - 2
    if line.endswith(("\n", "\r")):
        return len(line) - 1
    return len(line)


def column_index(line: str, character: int, encoding: str) -> int:
    """The code-point index in `line` of an LSP column counted in `encoding`'s code units.

    A column past the line's end means its end (LSP: it "defaults back to the line length"); a
    column inside a character's code units (half of a UTF-16 surrogate pair) means before it.
    """
    length = content_length(line)
    if encoding == types.PositionEncodingKind.Utf32 or line.isascii():
        return min(character, length)
    utf8 = encoding == types.PositionEncodingKind.Utf8
    units = 0
    for index in range(length):
        point = ord(line[index])
        if utf8:
            width = 1 if point < 0x80 else 2 if point < 0x800 else 3 if point < 0x10000 else 4
        else:
            width = 2 if point > 0xFFFF else 1
        units += width
        if units > character:
            return index
    return length


@dataclass(frozen=True)
class LineSplice:
    """A change as whole LSP lines: from line `line` on, the lines `before` became `after`.

    Exact where the change's positions are not (a change that joins a `\\r` and a `\\n` into one
    break changes the line above it too): undone on the lines after the change, it gives the
    lines before it, and applied to those, the lines after it.
    """

    line: int
    before: tuple[str, ...]
    after: tuple[str, ...]

    def apply(self, lines: list[str]) -> None:
        """Turn the lines before the change into the lines after it, in place."""
        lines[self.line : self.line + len(self.before)] = self.after

    def undo(self, lines: list[str]) -> None:
        """Turn the lines after the change into the lines before it, in place."""
        lines[self.line : self.line + len(self.after)] = self.before


@dataclass(frozen=True)
class TextChange:
    """One edit in code points: `[start, end)` of the text before it replaced by `text`.

    `line` and `character` are where `start` is (line, code points into it); `removed` is the
    text the edit replaced (empty for a whole-text change); `whole` marks a change of the whole
    text (full sync), not an edit at a range. A `Document` also says the change as whole lines
    (`lines`), and for a whole-text change the same change as the smallest edit at a range
    (`narrowed`: the text between the old and new text's common start and common end).
    """

    start: int
    end: int
    text: str
    line: int = 0
    whole: bool = False
    character: int = 0
    removed: str = ""
    lines: LineSplice | None = None
    narrowed: TextChange | None = None

    @property
    def delta(self) -> int:
        return len(self.text) - (self.end - self.start)


@dataclass(frozen=True)
class DocumentChange:
    """One `didChange` as every listener sees it: its edits in order, each in the code points of
    the text the one before left; `version` is the document's version after them."""

    uri: str
    version: int
    edits: tuple[TextChange, ...] = ()

    def lines_after_each(self, lines: Sequence[str]) -> Iterator[tuple[TextChange, Sequence[str]]]:
        """Each edit, in order, with the document's lines right after it, given `lines`, the
        document's lines after them all (LSP applies the edits of one `didChange` one after the
        other).

        The lines are undone from the last edit back to the first (each edit's `LineSplice`),
        then redone one edit at a time: one copy of the lines, edited in place between steps (read
        them before the next). Edits that do not say their lines (not made by a `Document`) are
        each handed `lines`.
        """
        splices = [edit.lines for edit in self.edits if edit.lines is not None]
        if len(self.edits) < 2 or len(splices) < len(self.edits):
            for edit in self.edits:
                yield edit, lines
            return
        current = list(lines)
        for splice in reversed(splices[1:]):
            splice.undo(current)
        for index, edit in enumerate(self.edits):
            if index:
                splices[index].apply(current)
            yield edit, current


class DocumentListener:
    """Told about document events after the server's document is updated; each method does
    nothing unless a listener overrides it."""

    def did_open(self, uri: str) -> None:
        """The editor opened `uri`; its text is in the workspace."""

    def did_change(self, change: DocumentChange) -> None:
        """The document changed (the edits in code points, the new version)."""

    def did_save(self, uri: str) -> None:
        """The editor saved `uri`."""

    def did_close(self, uri: str) -> None:
        """The editor closed `uri`; its text is gone from the workspace."""


class Document(TextDocument):
    """An open document's text as LSP lines, edited line by line.

    A `TextDocument` so that pygls's workspace can hold it and apply changes to it; the pygls
    helpers that read `lines` see LSP lines too.
    """

    def __init__(
        self,
        uri: str,
        text: str,
        *,
        version: int | None = None,
        language_id: str | None = None,
        position_codec: PositionCodec | None = None,
    ) -> None:
        super().__init__(uri, None, version, language_id, position_codec=position_codec)
        # The negotiated encoding (pygls's codec holds it); LSP's default is UTF-16.
        self.encoding: str = self.position_codec.encoding or types.PositionEncodingKind.Utf16
        # Edits come from the event loop while the model thread may read `source` (retrieval's
        # recent edits): without the lock, a text joined before an edit could be cached after it.
        self._lock = threading.Lock()
        self._applied: list[TextChange] = []  # since the last `take_change`
        self._reset(text)

    def _reset(self, text: str) -> None:
        with self._lock:
            self._reset_locked(text)

    def _reset_locked(self, text: str) -> None:
        self._lines = split_lines(text)
        self._text: str | None = text
        self._length = len(text)
        # _starts[i] is the offset of line i for i <= _starts_valid; later entries are rebuilt
        # on demand, so an edit near the cursor costs nothing at the far end of the document.
        self._starts = [0]
        self._starts_valid = 0

    # -- reading ------------------------------------------------------------------------------

    @property
    def source(self) -> str:
        """The whole text (joined once per version, when first asked for)."""
        with self._lock:
            if self._text is None:
                self._text = "".join(self._lines)
            return self._text

    @property
    def lines(self) -> tuple[str, ...]:
        return tuple(self._lines)

    @property
    def length(self) -> int:
        """The text's length in code points, without joining it."""
        return self._length

    @property
    def line_count(self) -> int:
        return len(self._lines)

    def line_start(self, line: int) -> int:
        """The code-point offset where line `line` (an existing line) begins."""
        with self._lock:
            if line > self._starts_valid:
                starts, valid = self._starts, self._starts_valid
                del starts[valid + 1 :]
                offsets = accumulate(map(len, self._lines[valid:line]), initial=starts[valid])
                starts.extend(islice(offsets, 1, None))  # the first is starts[valid] again
                self._starts_valid = line
            return self._starts[line]

    def server_position(self, position: types.Position) -> ServerTextPosition:
        """`position` in code points, clamped to the document as LSP says."""
        if position.line >= len(self._lines):
            # Past the last line: the end of the document.
            last = len(self._lines) - 1
            return ServerTextPosition(last, content_length(self._lines[last]))
        line = self._lines[position.line]
        return ServerTextPosition(
            position.line, column_index(line, position.character, self.encoding)
        )

    def offset_at_position(self, client_position: types.Position) -> int:
        """The code-point offset in `source` of an LSP position."""
        return self.offset_at_server_position(self.server_position(client_position))

    def offset_at_server_position(self, server_position: ServerTextPosition) -> int:
        return self.line_start(server_position.line) + server_position.character

    def position_from_client_units(self, position: types.Position) -> ServerTextPosition:
        return self.server_position(position)

    # -- editing ------------------------------------------------------------------------------

    def apply_change(self, change: types.TextDocumentContentChangeEvent) -> None:
        """Apply one `didChange` content change (a range edit or the whole text) and record it
        in code points for `take_change`."""
        if isinstance(change, types.TextDocumentContentChangePartial):
            start = self.server_position(change.range.start)
            end = self.server_position(change.range.end)
            offset = self.offset_at_server_position(start)
            until = max(offset, self.offset_at_server_position(end))
            removed = self._between(start, end) if until > offset else ""
            splice = self.replace(start, end, change.text)
            self._applied.append(
                TextChange(
                    offset,
                    until,
                    change.text,
                    line=start.line,
                    character=start.character,
                    removed=removed,
                    lines=splice,
                )
            )
        else:
            length = self._length
            with self._lock:
                before = self._lines
                self._reset_locked(change.text)
                narrowed = narrowed_change(before, self._lines)
            self._applied.append(
                TextChange(
                    0, length, change.text, whole=True, lines=narrowed.lines, narrowed=narrowed
                )
            )

    def _between(self, start: ServerTextPosition, end: ServerTextPosition) -> str:
        """The text from `start` to `end` (code points), read from the lines they span."""
        lines = self._lines
        if start.line == end.line:
            return lines[start.line][start.character : end.character]
        middle = "".join(lines[start.line + 1 : end.line])
        return lines[start.line][start.character :] + middle + lines[end.line][: end.character]

    def take_change(self) -> DocumentChange:
        """The changes applied since the last call, as one `DocumentChange` at this version."""
        applied, self._applied = self._applied, []
        return DocumentChange(self.uri, self.version or 0, tuple(applied))

    def replace(self, start: ServerTextPosition, end: ServerTextPosition, text: str) -> LineSplice:
        """Replace the text between two code-point positions; only the lines touched change.
        Answers the lines changed."""
        with self._lock:
            return self._replace_locked(start, end, text)

    def _replace_locked(
        self, start: ServerTextPosition, end: ServerTextPosition, text: str
    ) -> LineSplice:
        lines = self._lines
        end = max(start, end)  # a reversed range replaces nothing
        first, last = start.line, end.line
        removed = sum(map(len, lines[first : last + 1]))
        region = lines[first][: start.character] + text + lines[last][end.character :]
        if first > 0 and region.startswith("\n") and lines[first - 1].endswith("\r"):
            # The edit joins a `\r` ending the line above and a `\n` into one line break.
            first -= 1
            removed += len(lines[first])
            region = lines[first] + region
        replacement = split_lines(region)
        if last + 1 < len(lines):
            # The region ends with line `last`'s break, so its final (empty) line is the next
            # line's start, which stays where it is.
            replacement.pop()
        splice = LineSplice(first, tuple(lines[first : last + 1]), tuple(replacement))
        lines[first : last + 1] = replacement
        self._length += len(region) - removed
        self._text = None
        if first < self._starts_valid:
            del self._starts[first + 1 :]
            self._starts_valid = first
        return splice


def narrowed_change(before: Sequence[str], after: Sequence[str]) -> TextChange:
    """The change from the lines `before` to the lines `after` as the smallest edit at a range:
    the text between their common start and common end (found whole lines first, then within
    the lines that differ). Never starts or ends between the `\\r` and `\\n` of a break."""
    # At most the last line: equal texts make an empty edit at a place in the document.
    head = min(common_start(before, after), len(before) - 1, len(after) - 1)
    tail = common_end(before, after, head)
    old = tuple(before[head : len(before) - tail])
    new = tuple(after[head : len(after) - tail])
    old_text, new_text = "".join(old), "".join(new)
    start = common_start(old_text, new_text)
    if start and old_text[start - 1] == "\r":
        start -= 1
    end = common_end(old_text, new_text, start)
    if (
        end
        and old_text[-end] == "\n"
        and "\r" in (_at(old_text, -end - 1), _at(new_text, -end - 1))
    ):
        end -= 1
    removed = old_text[start : len(old_text) - end]
    above = split_lines(old_text[:start])
    offset = sum(map(len, before[:head])) + start
    return TextChange(
        offset,
        offset + len(removed),
        new_text[start : len(new_text) - end],
        line=head + len(above) - 1,
        character=len(above[-1]),
        removed=removed,
        lines=LineSplice(head, old, new),
    )


def _at(text: str, index: int) -> str:
    """The character at `index` (negative: from the end), or "" where there is none."""
    return text[index] if -len(text) <= index < 0 else ""


def open_document(workspace: Workspace, uri: str) -> Document | None:
    """The open document at `uri`, None when the editor has not opened it.

    pygls's `get_text_document` answers a document backed by the file on disk for a URI the
    editor never opened; that file must not reach a prompt, so only adopted documents count.
    """
    document = workspace.get_text_document(uri)  # reads nothing until `source` is asked for
    return document if isinstance(document, Document) else None


def adopt(workspace: Workspace, item: types.TextDocumentItem) -> Document:
    """Put a `Document` for a just-opened `item` in the workspace in place of pygls's copy."""
    document = Document(
        item.uri,
        item.text,
        version=item.version,
        language_id=item.language_id,
        position_codec=workspace.position_codec,
    )
    placed = workspace.get_text_document(item.uri)
    documents = workspace.text_documents
    # Found by identity: the workspace keys documents by its own normalisation of the URI.
    key = next((k for k, v in documents.items() if v is placed), None)
    if key is not None:
        documents[key] = document
    return document
