"""Outcome inference: the tracker fed by a simulated editor and a manual clock."""

from __future__ import annotations

import pytest

from lsp_server.outcomes import (
    OutcomeTracker,
    TextChange,
    map_end,
    map_start,
    retained_chars,
)
from telemetry.events import OutcomeEvent, RetentionEvent

DOC = "file:///work/a.py"
OTHER = "file:///work/b.py"


class Editor:
    """Documents, a clock and a tracker, driven like an editor would drive the server."""

    def __init__(self, ignore_after_s: float = 10.0) -> None:
        self.now = 1000.0
        self.texts: dict[str, str] = {DOC: "def f(x):\n    \n", OTHER: "y = 1\n"}
        self.events: list[OutcomeEvent | RetentionEvent] = []
        self.kept: list[tuple[str, str]] = []
        self.tracker = OutcomeTracker(
            self.events.append,
            ignore_after_s=ignore_after_s,
            clock=lambda: self.now,
            text_of=self.texts.get,
            kept=lambda did, text: self.kept.append((did, text)),
        )

    def suggest(self, text: str, at: int = 14, uri: str = DOC, did: str = "d1") -> None:
        self.tracker.decision(did, uri, at, text, shown=True)

    def edit(self, start: int, end: int, text: str, uri: str = DOC) -> None:
        old = self.texts[uri]
        self.texts[uri] = old[:start] + text + old[end:]
        self.tracker.changed(uri, [TextChange(start, end, text)])

    def type(self, chars: str, at: int, uri: str = DOC) -> None:
        for i, char in enumerate(chars):
            self.edit(at + i, at + i, char, uri)

    def wait(self, seconds: float) -> None:
        self.now += seconds
        self.tracker.tick()

    def outcomes(self, did: str = "d1") -> list[tuple[str, int | None, str | None]]:
        return [
            (e.kind, e.accepted_chars, e.reason)
            for e in self.events
            if isinstance(e, OutcomeEvent) and e.decision_id == did
        ]

    def retention(self) -> list[tuple[int, int, int]]:
        return [
            (e.after_s, e.accepted_chars, e.retained_chars)
            for e in self.events
            if isinstance(e, RetentionEvent)
        ]


SUGGESTION = "return x + 1"


def full_insert(e: Editor) -> None:
    e.edit(14, 14, SUGGESTION)
    e.tracker.accepted("d1")  # VS Code runs the command after applying the edit


def command_then_insert(e: Editor) -> None:
    e.tracker.accepted("d1")
    e.edit(14, 14, SUGGESTION)


def accept_word_then_new_request(e: Editor) -> None:
    e.edit(14, 14, "return ")
    e.suggest("x + 1", at=21, did="d2")


def accept_word_then_timeout(e: Editor) -> None:
    e.edit(14, 14, "return ")
    e.wait(10)


def type_through_then_diverge(e: Editor) -> None:
    e.type("ret", 14)
    e.type("x", 17)


def diverge(e: Editor) -> None:
    e.type("pass", 14)


def backspace(e: Editor) -> None:
    e.edit(13, 14, "")


def edit_elsewhere(e: Editor) -> None:
    e.edit(0, 0, "# hi\n")


def request_in_other_document(e: Editor) -> None:
    e.suggest("2", at=5, uri=OTHER, did="d2")


def close(e: Editor) -> None:
    e.tracker.closed(DOC)


def time_out(e: Editor) -> None:
    e.wait(9.9)
    assert e.outcomes() == []
    e.wait(0.1)


def dismiss(e: Editor) -> None:
    e.tracker.dismissed("d1")


def supersede(e: Editor) -> None:
    e.type("r", 14)
    e.suggest("eturn x + 1", at=15, did="d2")


def silence_supersedes(e: Editor) -> None:
    e.tracker.decision("d2", DOC, 14, "", shown=False)


def accept_word_then_dismiss(e: Editor) -> None:
    e.edit(14, 14, "return x")
    e.tracker.dismissed("d1")


@pytest.mark.parametrize(
    ("act", "expected"),
    [
        pytest.param(full_insert, [("accepted", 12, None)], id="full-accept"),
        pytest.param(command_then_insert, [("accepted", 12, None)], id="command-before-edit"),
        pytest.param(accept_word_then_new_request, [("partial", 7, None)], id="partial"),
        pytest.param(accept_word_then_timeout, [("partial", 7, None)], id="partial-timeout"),
        pytest.param(accept_word_then_dismiss, [("partial", 8, None)], id="partial-dismiss"),
        pytest.param(
            type_through_then_diverge, [("ignored", None, "diverged")], id="typed-diverged"
        ),
        pytest.param(diverge, [("ignored", None, "diverged")], id="diverged"),
        pytest.param(backspace, [("ignored", None, "diverged")], id="backspace"),
        pytest.param(edit_elsewhere, [("ignored", None, "moved")], id="edit-elsewhere"),
        pytest.param(request_in_other_document, [("ignored", None, "moved")], id="other-document"),
        pytest.param(close, [("ignored", None, "closed")], id="closed"),
        pytest.param(time_out, [("ignored", None, "timeout")], id="timeout"),
        pytest.param(dismiss, [("dismissed", None, None)], id="dismissed"),
        pytest.param(supersede, [("superseded", None, None)], id="superseded"),
        pytest.param(silence_supersedes, [("superseded", None, None)], id="silence-supersedes"),
    ],
)
def test_outcomes(act: object, expected: list[tuple[str, int | None, str | None]]) -> None:
    editor = Editor()
    editor.suggest(SUGGESTION)
    act(editor)  # type: ignore[operator]
    assert editor.outcomes() == expected
    editor.wait(10)  # nothing more fires later
    assert editor.outcomes() == expected


def test_silence_alone_has_no_outcome() -> None:
    editor = Editor()
    editor.tracker.decision("d1", DOC, 14, "", shown=False)
    editor.wait(60)
    assert editor.events == []


def test_did_show_moves_the_timeout_and_the_time_to_outcome() -> None:
    editor = Editor()
    editor.suggest(SUGGESTION)
    editor.wait(5)
    editor.tracker.shown("d1")
    editor.wait(9)
    assert editor.outcomes() == []
    editor.wait(1)
    (event,) = editor.events
    assert isinstance(event, OutcomeEvent)
    assert (event.kind, event.time_to_outcome_ms) == ("ignored", 10_000.0)


def test_timeout_is_configurable() -> None:
    editor = Editor(ignore_after_s=0.5)
    editor.suggest(SUGGESTION)
    assert editor.tracker.next_deadline() == editor.now + 0.5
    editor.wait(0.5)
    assert editor.outcomes() == [("ignored", None, "timeout")]


def test_retention_follows_later_edits() -> None:
    editor = Editor()
    editor.suggest(SUGGESTION)
    full_insert(editor)
    editor.edit(0, 0, "import os\n")  # before: the range shifts
    editor.wait(30)
    editor.edit(10 + 14 + 11, 10 + 14 + 12, "2")  # "+ 1" -> "+ 2": one character changes
    editor.edit(len(editor.texts[DOC]), len(editor.texts[DOC]), "\nprint(f(1))\n")  # after
    editor.wait(90)
    start = editor.texts[DOC].index("return")
    editor.edit(start, start + len("return x + 2"), "")  # the whole line removed
    editor.wait(480)
    assert editor.retention() == [(30, 12, 12), (120, 12, 11), (600, 12, 0)]
    assert editor.kept == [("d1", SUGGESTION)]  # what stood at the first checkpoint, once
    editor.wait(600)
    assert len(editor.retention()) == 3  # tracking ended at the last checkpoint
    assert editor.tracker.next_deadline() is None


def test_retention_of_a_partial_acceptance_counts_only_accepted_text() -> None:
    editor = Editor()
    editor.suggest(SUGGESTION)
    editor.edit(14, 14, "return ")
    editor.type("y", 21)  # diverges after the accepted word
    assert editor.outcomes() == [("partial", 7, None)]
    editor.wait(30)
    assert editor.retention() == [(30, 7, 7)]


def test_retention_of_a_closed_document_is_what_it_was_at_close() -> None:
    editor = Editor()
    editor.suggest(SUGGESTION)
    full_insert(editor)
    editor.edit(14, 20, "yield")  # "return" -> "yield"
    editor.tracker.closed(DOC)
    del editor.texts[DOC]
    editor.wait(30)
    assert editor.retention() == [(30, 12, 7)]
    assert editor.kept == [("d1", "yield x + 1")]  # the user's edit is what was kept


def test_the_kept_text_starts_at_the_suggestion_with_what_was_typed_through() -> None:
    editor = Editor()
    editor.suggest(SUGGESTION)
    editor.type("re", 14)  # typing through: not accepted
    editor.edit(16, 16, "turn x")  # accept-word from there on
    editor.type(" * 3", 22)  # " " types through; "*" diverges: partial
    assert editor.outcomes() == [("partial", 6, None)]
    editor.wait(30)
    assert editor.kept == [("d1", "return x ")]  # the suggestion's part, up to where it ended


@pytest.mark.parametrize(
    ("offset", "change", "start", "end"),
    [
        pytest.param(10, TextChange(2, 4, "abc"), 11, 11, id="before-shifts"),
        pytest.param(10, TextChange(12, 14, ""), 10, 10, id="after-stays"),
        pytest.param(10, TextChange(10, 10, "ab"), 12, 10, id="insert-at-boundary"),
        pytest.param(10, TextChange(8, 12, "z"), 9, 8, id="inside-replaced"),
        pytest.param(10, TextChange(10, 12, ""), 10, 10, id="delete-from-boundary"),
        pytest.param(10, TextChange(10, 12, "xyz"), 10, 10, id="replace-from-boundary"),
        pytest.param(10, TextChange(9, 12, "xyz"), 12, 9, id="replace-across-boundary"),
    ],
)
def test_range_mapping(offset: int, change: TextChange, start: int, end: int) -> None:
    assert map_start(offset, change) == start
    assert map_end(offset, change) == end


@pytest.mark.parametrize(
    ("accepted", "current", "kept"),
    [
        pytest.param("return x", "return x", 8, id="intact"),
        pytest.param("return x", "", 0, id="gone"),
        pytest.param("return x", "return  x + 1", 8, id="extended"),
        pytest.param("return x", "yield x", 3, id="rewritten"),
        pytest.param("abc", "cba", 1, id="reordered"),
    ],
)
def test_retained_chars(accepted: str, current: str, kept: int) -> None:
    assert retained_chars(accepted, current) == kept


# -- several candidates ------------------------------------------------------------------------


def suggest_candidates(editor: Editor) -> None:
    editor.tracker.decision(
        "d1", DOC, 14, "return x", shown=True, alternatives=[("d2", "pass"), ("d3", "raise")]
    )


def test_unseen_candidates_are_not_viewed_never_ignored() -> None:
    editor = Editor()
    suggest_candidates(editor)
    editor.tracker.accepted("d1")
    assert editor.outcomes("d1") == [("accepted", 8, None)]
    assert editor.outcomes("d2") == [("not_viewed", None, None)]
    assert editor.outcomes("d3") == [("not_viewed", None, None)]


def test_the_outcome_belongs_to_the_candidate_on_screen() -> None:
    editor = Editor()
    suggest_candidates(editor)
    editor.tracker.shown("d2")  # the user cycled to the second candidate
    editor.edit(14, 14, "pass")  # and accepted it
    assert editor.outcomes("d2") == [("accepted", 4, None)]
    assert editor.outcomes("d1") == [("ignored", None, None)]  # seen, and passed over
    assert editor.outcomes("d3") == [("not_viewed", None, None)]


def test_typing_past_a_cycled_to_candidate_ignores_it_and_the_first() -> None:
    editor = Editor()
    suggest_candidates(editor)
    editor.tracker.shown("d1")  # the first candidate drawn
    editor.tracker.shown("d2")  # the user cycled to the second one
    editor.type("x", at=14)  # and typed on, past both
    assert editor.outcomes("d2") == [("ignored", None, "diverged")]
    assert editor.outcomes("d1") == [("ignored", None, "diverged")]  # seen first, passed over
    assert editor.outcomes("d3") == [("not_viewed", None, None)]


def test_a_shown_candidate_that_no_longer_fits_the_typing_is_not_switched_to() -> None:
    editor = Editor()
    suggest_candidates(editor)
    editor.type("re", at=14)  # typing through "return x"
    editor.tracker.shown("d2")  # "pass" cannot be on screen after "re"
    editor.type("x", at=16)
    assert editor.outcomes("d1") == [("ignored", None, "diverged")]
    assert editor.outcomes("d2") == [("not_viewed", None, None)]


def test_accepting_a_candidate_by_command_switches_to_it() -> None:
    editor = Editor()
    suggest_candidates(editor)
    editor.tracker.accepted("d3")
    assert editor.outcomes("d3") == [("accepted", 5, None)]
    assert editor.outcomes("d1") == [("ignored", None, None)]
    assert editor.outcomes("d2") == [("not_viewed", None, None)]


def test_ignoring_every_candidate_ignores_only_those_seen() -> None:
    editor = Editor()
    suggest_candidates(editor)
    editor.tracker.shown("d2")
    editor.tracker.shown("d1")  # cycled back
    editor.wait(11)
    assert editor.outcomes("d1") == [("ignored", None, "timeout")]
    assert editor.outcomes("d2") == [("ignored", None, "timeout")]
    assert editor.outcomes("d3") == [("not_viewed", None, None)]
