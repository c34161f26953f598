"""The state that accepting a prediction leads to, and the predictor's kept rewrites: a
prediction computed there ahead answers the request after the acceptance without a model call."""

from __future__ import annotations

import random

import pytest

from completion.next_edit import Edit, EditHistory, NextEditPredictor, NextEditSettings
from completion.next_edit.accepted import accepted_state, cursor_after
from completion.next_edit.text import document_lines
from tests.support.scripted_model import ScriptedModel

SEP = "<|file_sep|>"
BEFORE = """\
def scale(width, factor):
    wide = width * factor
    return wide + width
"""
# The user renames `width` on line 0; the model carries it on, one use per prediction.
RENAMED = BEFORE.replace("scale(width,", "scale(w,")
STEP1 = RENAMED.replace("wide = width", "wide = w")
STEP2 = STEP1.replace("wide + width", "wide + w")


def offset_of(text: str, line: int, character: int) -> int:
    lines = document_lines(text)
    return sum(len(lines[k]) for k in range(line)) + character


def position_of(text: str, offset: int) -> tuple[int, int]:
    lines = document_lines(text)
    line = 0
    while line < len(lines) - 1 and offset >= len(lines[line]):
        offset -= len(lines[line])
        line += 1
    return line, offset


def applied_by_offsets(text: str, edits: list[Edit]) -> tuple[str, tuple[int, int]]:
    """The text after `edits` and the cursor as the VS Code client computes it (the last
    edit's start, shifted by the edits before it, plus its text: `offsetAfterApply`)."""
    spans = [
        (offset_of(text, e.start_line, e.start_character), offset_of(text, *e.range[2:]), e.text)
        for e in edits
    ]
    out = text
    for start, end, new in reversed(spans):
        out = out[:start] + new + out[end:]
    shift = sum(len(new) - (end - start) for start, end, new in spans[:-1])
    start, _, new = spans[-1]
    return out, position_of(out, start + shift + len(new))


def random_edits(rng: random.Random, text: str) -> list[Edit]:
    """Up to 3 sorted, non-overlapping edits of `text`, some across lines or on one line."""
    places = [k for k in range(len(text) + 1) if text[k - 1 : k + 1] != "\r\n"]  # not in CRLF
    cuts = sorted(rng.sample(places, k=min(len(places) // 2 * 2, 2 * rng.randint(1, 3))))
    pieces = ["", "x", "new_name", "a\nb", "\n", "line\r\n", "  # note\n    more"]
    edits = []
    for start, end in zip(cuts[::2], cuts[1::2], strict=True):
        (sl, sc), (el, ec) = position_of(text, start), position_of(text, end)
        edits.append(Edit(sl, sc, el, ec, rng.choice(pieces), text[start:end]))
    return edits


def test_the_accepted_document_and_cursor_are_those_an_editor_makes() -> None:
    rng = random.Random(7)
    texts = [BEFORE, BEFORE.rstrip("\n"), "a = 1\r\nb = 2\r\n", "x", "one\ntwo\n\nfour"]
    for _ in range(500):
        text = rng.choice(texts)
        edits = [e for e in random_edits(rng, text) if e.text != e.removed]
        if not edits:
            continue
        history = EditHistory(clock=lambda: 5.0)
        state = accepted_state(document_lines(text), edits, history, "f.py")
        expected, cursor = applied_by_offsets(text, edits)
        assert "".join(state.lines) == expected
        assert list(state.lines) == list(document_lines(expected))
        assert state.cursor == cursor == cursor_after(edits)


def test_the_acceptance_is_an_event_of_its_own_as_the_server_records_it() -> None:
    clock = [10.0]
    history = EditHistory(clock=lambda: clock[0])
    history.record_edit("f.py", document_lines(RENAMED), 0, 10, "width", "w")
    # Taken 0.4 s after the user's edit, close to it: an edit the user typed would merge.
    clock[0] = 10.4
    edit = Edit(1, 12, 1, 16, "", "idth")  # "wide = width" -> "wide = w"
    state = accepted_state(document_lines(RENAMED), [edit], history, "f.py")
    assert "".join(state.lines) == STEP1
    assert state.cursor == (1, 12) and state.at == 10.4
    first, accepted = history.events()
    assert first.updated_text == "".join(document_lines(RENAMED)[0:3])
    assert accepted.original_text == "".join(document_lines(RENAMED)[0:4])
    assert accepted.updated_text == "".join(document_lines(STEP1)[0:4])
    # The server records the editor's change the same way when it comes (`new_event`).
    server = EditHistory(clock=lambda: clock[0])
    server.record_edit("f.py", document_lines(RENAMED), 0, 10, "width", "w", now=10.0)
    server.record_edit("f.py", document_lines(STEP1), 1, 12, "idth", "", now=10.6, new_event=True)
    assert [(e.start, e.original, e.updated) for e in server.events()] == [
        (e.start, e.original, e.updated) for e in history.events()
    ]
    typed = EditHistory(clock=lambda: clock[0])  # typed by the user, it merges
    typed.record_edit("f.py", document_lines(RENAMED), 0, 10, "width", "w", now=10.0)
    typed.record_edit("f.py", document_lines(STEP1), 1, 12, "idth", "", now=10.6)
    assert len(typed.events()) == 1


def test_nothing_to_accept_or_an_edit_outside_the_document_is_an_error() -> None:
    lines = document_lines(BEFORE)
    with pytest.raises(ValueError, match="no edits"):
        accepted_state(lines, [], EditHistory(), "f.py")
    with pytest.raises(ValueError, match="outside the document"):
        accepted_state(lines, [Edit(9, 0, 9, 0, "x")], EditHistory(), "f.py")


def chain_model() -> ScriptedModel:
    """Renames one more use of `width` at each state of the window."""
    return ScriptedModel(
        rules={
            f"{SEP}current/f.py\n{RENAMED}{SEP}updated/f.py\n": STEP1 + SEP,
            f"{SEP}current/f.py\n{STEP1}{SEP}updated/f.py\n": STEP2 + SEP,
        }
    )


def chain_predictor(model: ScriptedModel, keep: int) -> NextEditPredictor:
    return NextEditPredictor(model, NextEditSettings(screen_below=0), keep=keep)


def test_a_prediction_computed_ahead_answers_the_request_after_the_acceptance() -> None:
    clock = [10.0]
    history = EditHistory(clock=lambda: clock[0])
    history.record_edit("f.py", document_lines(RENAMED), 0, 10, "width", "w")
    model = chain_model()
    predictor = chain_predictor(model, keep=4)
    clock[0] = 10.3  # after the clients' debounce
    shown = predictor.predict(RENAMED, "f.py", (0, 10), history)
    assert [(e.range, e.text) for e in shown.edits] == [((1, 12, 1, 16), "")]

    # Ahead, while the user reads it: the state accepting it leads to.
    ahead = history.snapshot()
    state = accepted_state(document_lines(RENAMED), shown.edits, ahead, "f.py")
    computed = predictor.predict(state.lines, "f.py", state.cursor, ahead, now=state.at)
    assert computed.reason == "predicted" and len(model.prompts) == 2

    # The user accepts at once, within the pause that merges edits; the server records the
    # editor's change as an event of its own, as the prediction computed ahead did.
    clock[0] = 10.8
    history.record_edit("f.py", document_lines(STEP1), 1, 12, "idth", "", new_event=True)
    assert len(history.events()) == 2
    answer = predictor.predict(STEP1, "f.py", (1, 12), history)
    assert answer.timings.reused and answer.timings.reached_model
    assert len(model.prompts) == 2  # no model call
    assert [(e.range, e.text) for e in answer.edits] == [((2, 19, 2, 23), "")]
    assert answer.edits == computed.edits and answer.predicted == computed.predicted


def test_kept_rewrites_answer_only_the_same_prompt_on_the_same_model() -> None:
    def predict(predictor: NextEditPredictor, text: str) -> bool:
        history = EditHistory(clock=lambda: 10.0)
        history.record_edit("f.py", document_lines(RENAMED), 0, 10, "width", "w")
        if text == STEP1:
            history.record_edit("f.py", document_lines(STEP1), 1, 12, "idth", "", now=10.5)
        return predictor.predict(text, "f.py", (0, 10), history).timings.reused

    model = chain_model()
    predictor = chain_predictor(model, keep=1)
    assert [predict(predictor, RENAMED), predict(predictor, RENAMED)] == [False, True]
    assert predict(predictor, STEP1) is False  # another prompt
    assert predict(predictor, RENAMED) is False  # pushed out: one is kept
    model.model_id = "scripted+adapter"  # another adapter: the same prompt is asked again
    assert predict(predictor, RENAMED) is False
    assert len(model.prompts) == 4
    # Without `keep` (evaluations), every prediction calls the model.
    plain = chain_predictor(model, keep=0)
    assert [predict(plain, RENAMED), predict(plain, RENAMED)] == [False, False]
    assert len(model.prompts) == 6
