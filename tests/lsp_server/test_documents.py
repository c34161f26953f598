"""Open documents as LSP counts lines and columns: positions, prefixes, incremental edits."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lsprotocol import types
from pygls.workspace import Workspace
from pygls.workspace.position_codec import PositionCodec

import lsp_server.documents as documents
from lsp_server.documents import Document, adopt, open_document, split_lines
from lsp_server.features.inline import build_request

UTF8 = types.PositionEncodingKind.Utf8
UTF16 = types.PositionEncodingKind.Utf16
UTF32 = types.PositionEncodingKind.Utf32


def document(text: str, encoding: str = UTF16) -> Document:
    return Document(
        "file:///work/example.py", text, version=1, position_codec=PositionCodec(encoding)
    )


def at(line: int, character: int) -> types.Position:
    return types.Position(line=line, character=character)


# -- a reference written from the LSP text, sharing nothing with the module -----------------------


def reference_lines(text: str) -> list[str]:
    """LSP lines: only `\\r\\n`, `\\n` and `\\r` break a line."""
    parts = re.split(r"(\r\n|\r|\n)", text)
    return [
        parts[i] + (parts[i + 1] if i + 1 < len(parts) else "") for i in range(0, len(parts), 2)
    ]


def reference_offset(text: str, position: types.Position, encoding: str = UTF16) -> int:
    lines = reference_lines(text)
    if position.line >= len(lines):
        return len(text)
    content = re.sub(r"(\r\n|\r|\n)$", "", lines[position.line])
    codec = {UTF8: "utf-8", UTF16: "utf-16-le", UTF32: "utf-32-le"}[encoding]
    per_unit = {UTF8: 1, UTF16: 2, UTF32: 4}[encoding]
    column, units = len(content), 0
    for index, char in enumerate(content):
        units += len(char.encode(codec)) // per_unit
        if units > position.character:  # inside or after this character: stop before it
            column = index
            break
    return sum(map(len, lines[: position.line])) + column


# -- positions and the prefix the model sees -------------------------------------------------------


PREFIX_CASES = [
    pytest.param("a\fb\nxyz", at(1, 1), UTF16, "a\fb\nx", id="form-feed-is-not-a-line-break"),
    pytest.param("a\u2028b\nxyz", at(1, 1), UTF16, "a\u2028b\nx", id="u2028-is-not-a-line-break"),
    pytest.param("a\x85b\nxyz", at(1, 1), UTF16, "a\x85b\nx", id="u0085-is-not-a-line-break"),
    pytest.param(
        "a\vb\x1c\x1d\x1e\u2029\nxy",
        at(1, 2),
        UTF16,
        "a\vb\x1c\x1d\x1e\u2029\nxy",
        id="other-splitlines-breaks-are-not-either",
    ),
    pytest.param("ab\r\ncd\r\nef", at(1, 1), UTF16, "ab\r\nc", id="crlf"),
    pytest.param("ab\r\ncd", at(0, 9), UTF16, "ab", id="crlf-column-past-the-end-stops-before-it"),
    pytest.param("ab\rcd\ref", at(2, 1), UTF16, "ab\rcd\re", id="lone-cr"),
    pytest.param("x = '😋'; y", at(0, 7), UTF16, "x = '😋", id="emoji-counts-two-utf16-units"),
    pytest.param("x = '😋'; y", at(0, 8), UTF16, "x = '😋'", id="after-the-emoji"),
    pytest.param("x = '😋'; y", at(0, 6), UTF16, "x = '", id="inside-a-surrogate-pair-is-before"),
    pytest.param("é😋z", at(0, 6), UTF8, "é😋", id="utf8-units"),
    pytest.param("é😋z", at(0, 2), UTF32, "é😋", id="utf32-units"),
    pytest.param(
        "ab\ncd", at(1, 10), UTF16, "ab\ncd", id="past-the-end-of-an-unterminated-last-line"
    ),
    pytest.param("ab\ncd\n", at(0, 10), UTF16, "ab", id="past-the-end-of-a-terminated-line"),
    pytest.param("ab\ncd\n", at(2, 0), UTF16, "ab\ncd\n", id="the-empty-line-after-a-final-break"),
    pytest.param("ab\ncd", at(7, 3), UTF16, "ab\ncd", id="past-the-last-line-is-the-end"),
    pytest.param("", at(0, 4), UTF16, "", id="empty-document"),
]


@pytest.mark.parametrize(("text", "position", "encoding", "prefix"), PREFIX_CASES)
def test_build_request_splits_at_the_lsp_position(
    text: str, position: types.Position, encoding: str, prefix: str
) -> None:
    request = build_request(document(text, encoding), position, "automatic")
    assert request.prefix == prefix
    assert request.prefix + request.suffix == text
    assert len(prefix) == reference_offset(text, position, encoding)


@pytest.mark.parametrize(
    ("text", "lines"),
    [
        pytest.param("", [""], id="empty"),
        pytest.param("a", ["a"], id="one-line"),
        pytest.param("a\n", ["a\n", ""], id="final-break"),
        pytest.param("a\r\n\r\nb", ["a\r\n", "\r\n", "b"], id="crlf"),
        pytest.param("a\n\rb", ["a\n", "\r", "b"], id="lf-then-cr-is-two-breaks"),
        pytest.param("a\fb\u2028c\x85d", ["a\fb\u2028c\x85d"], id="no-lsp-break"),
    ],
)
def test_split_lines(text: str, lines: list[str]) -> None:
    assert split_lines(text) == lines == reference_lines(text)


# -- incremental edits ---------------------------------------------------------------------------

ALPHABET = st.sampled_from(["a", "b", " ", "\n", "\r", "\r\n", "\f", "\u2028", "\x85", "😋", "é"])
TEXTS = st.lists(ALPHABET, max_size=40).map("".join)


@st.composite
def edits(draw: st.DrawFn) -> tuple[types.Position, types.Position, str]:
    # Positions may lie past line ends, past the last line, or inside a surrogate pair.
    start = at(draw(st.integers(0, 8)), draw(st.integers(0, 8)))
    end = at(draw(st.integers(0, 8)), draw(st.integers(0, 8)))
    if (end.line, end.character) < (start.line, start.character):
        start, end = end, start
    return start, end, draw(TEXTS)


@settings(max_examples=300, deadline=None)
@given(
    text=TEXTS,
    changes=st.lists(edits(), max_size=12),
    encoding=st.sampled_from([UTF8, UTF16, UTF32]),
)
def test_incremental_edits_equal_full_replacement(
    text: str, changes: list[tuple[types.Position, types.Position, str]], encoding: str
) -> None:
    edited = document(text, encoding)
    expected = text
    for start, end, new_text in changes:
        # Read a position first, so the line offsets are cached and must follow the edit.
        edited.offset_at_position(end)
        begin = reference_offset(expected, start, encoding)
        stop = max(begin, reference_offset(expected, end, encoding))
        before = expected
        expected = expected[:begin] + new_text + expected[stop:]
        edited.apply_change(
            types.TextDocumentContentChangePartial(range=types.Range(start, end), text=new_text)
        )
        (change,) = edited.take_change().edits
        # The change says what it replaced, and where it starts as (line, character).
        assert change.removed == before[begin:stop]
        line_start = sum(map(len, reference_lines(before)[: change.line]))
        assert line_start + change.character == change.start == begin
        assert edited.source == expected
        assert list(edited.lines) == reference_lines(expected)
        assert (edited.length, edited.line_count) == (len(expected), len(reference_lines(expected)))
    for line in range(edited.line_count + 1):
        for character in (0, 1, 3, 50):
            position = at(line, character)
            assert edited.offset_at_position(position) == reference_offset(
                expected, position, encoding
            )


@settings(max_examples=300, deadline=None)
@given(text=TEXTS, changes=st.lists(edits(), min_size=1, max_size=6), whole=TEXTS)
def test_the_edits_of_one_didchange_are_each_read_against_the_text_they_left(
    text: str, changes: list[tuple[types.Position, types.Position, str]], whole: str
) -> None:
    edited = document(text)
    expected = [text]
    for start, end, new_text in changes:
        begin = reference_offset(expected[-1], start)
        stop = max(begin, reference_offset(expected[-1], end))
        expected.append(expected[-1][:begin] + new_text + expected[-1][stop:])
        edited.apply_change(
            types.TextDocumentContentChangePartial(range=types.Range(start, end), text=new_text)
        )
    edited.apply_change(types.TextDocumentContentChangeWholeDocument(text=whole))
    expected.append(whole)
    change = edited.take_change()
    after_each = [(edit, list(lines)) for edit, lines in change.lines_after_each(edited.lines)]
    assert [edit for edit, _ in after_each] == list(change.edits)
    assert [lines for _, lines in after_each] == [reference_lines(t) for t in expected[1:]]


@settings(max_examples=300, deadline=None)
@given(shared=TEXTS, old=TEXTS, new=TEXTS, tail=TEXTS)
def test_a_whole_text_change_is_narrowed_to_the_edit_it_makes(
    shared: str, old: str, new: str, tail: str
) -> None:
    before, after = shared + old + tail, shared + new + tail
    edited = document(before)
    edited.apply_change(types.TextDocumentContentChangeWholeDocument(text=after))
    (change,) = edited.take_change().edits
    assert change.whole and (change.start, change.end, change.text) == (0, len(before), after)
    narrowed = change.narrowed
    assert narrowed is not None
    # The smallest edit: what differs between the texts' start and end, and at each end the
    # `\r` or `\n` of a break it would split.
    assert len(narrowed.removed) <= len(old) + 2 and len(narrowed.text) <= len(new) + 2
    assert before[narrowed.start : narrowed.end] == narrowed.removed
    assert before[: narrowed.start] + narrowed.text + before[narrowed.end :] == after
    # Where it starts, as LSP counts lines (never between a `\r` and its `\n`).
    place = at(narrowed.line, narrowed.character)
    assert narrowed.start == reference_offset(before, place, UTF32)
    lines = reference_lines(before)
    assert narrowed.character <= len(lines[narrowed.line].rstrip("\r\n"))
    assert narrowed.lines is not None and change.lines == narrowed.lines
    narrowed.lines.apply(lines)
    assert lines == reference_lines(after)


def test_a_whole_text_change_replaces_everything() -> None:
    edited = document("one\ntwo")
    edited.offset_at_position(at(1, 1))
    edited.apply_change(types.TextDocumentContentChangeWholeDocument(text="x\r\ny"))
    assert edited.source == "x\r\ny"
    assert edited.offset_at_position(at(1, 1)) == 4


def test_a_one_character_edit_splits_only_its_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Complexity, not time: typing in a big document re-splits a line, not the document."""
    big = "".join(f"value_{i} = compute(value_{i - 1})\n" for i in range(20_000))
    edited = document(big)
    split = []
    monkeypatch.setattr(
        documents, "split_lines", lambda text: split.append(len(text)) or split_lines(text)
    )
    for column in range(50):
        position = at(10_000, column)
        edited.apply_change(
            types.TextDocumentContentChangePartial(range=types.Range(position, position), text="x")
        )
    edited.apply_change(
        types.TextDocumentContentChangePartial(
            range=types.Range(at(10_000, 0), at(10_000, 0)), text="\n"
        )
    )
    assert len(split) == 51
    assert max(split) < 200  # the edited line, never the 700 kB around it
    assert edited.source.count("\n") == 20_001


# -- the workspace ---------------------------------------------------------------------------------


def test_adopted_documents_take_the_workspace_changes_and_unopened_ones_are_none(
    tmp_path: pytest.TempPathFactory,
) -> None:
    workspace = Workspace(None)
    uri = "file:///work/a%20b.py"  # the workspace keys documents by an unquoted URI
    item = types.TextDocumentItem(uri=uri, language_id="python", version=1, text="a\fb\nc")
    workspace.put_text_document(item)
    adopted = adopt(workspace, item)
    workspace.update_text_document(
        types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        types.TextDocumentContentChangePartial(range=types.Range(at(1, 1), at(1, 1)), text="d"),
    )
    assert open_document(workspace, uri) is adopted
    assert (adopted.source, adopted.version) == ("a\fb\ncd", 2)
    assert open_document(workspace, "file:///etc/passwd") is None


def test_a_reader_thread_never_caches_a_text_from_before_an_edit() -> None:
    # Retrieval reads `source` on the model thread while the event loop applies edits.
    import sys
    import threading

    from pygls.workspace.position_codec import ServerTextPosition

    lines = [f"line {i} = {i}\n" for i in range(2000)]
    doc = Document("file:///w/a.py", "".join(lines), version=1)
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            _ = doc.source

    reader = threading.Thread(target=read)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often, so the race window is hit
    reader.start()
    stale = 0
    try:
        for i in range(3000):
            row = i % len(lines)
            where = ServerTextPosition(row, 0)
            doc.replace(where, where, "x")
            lines[row] = "x" + lines[row]
            stale += doc.source != "".join(lines)
    finally:
        done.set()
        reader.join()
        sys.setswitchinterval(switch)
    assert stale == 0
