"""The predictor on a scripted model: no model call without a recent edit near the cursor,
rewrites turned into edits, and the guards."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from completion.next_edit import EditHistory, NextEditPredictor, NextEditSettings
from completion.next_edit.predictor import fences_end_rewrites, rewritten_window, stop_rule
from completion.next_edit.text import document_lines
from completion.types import Cancelled, CancelToken, Generation, StopRule
from tests.support.scripted_model import ScriptedModel

BEFORE = """\
def area(width, height):
    return width * height


def show(width, height):
    print(area(width, height))
    print("width", width)
"""
# The user renamed the first parameter; the model is scripted to rename its use below too.
AFTER = BEFORE.replace("def area(width, height)", "def area(w, height)")
PREDICTED = AFTER.replace("return width * height", "return w * height")


def recorded(clock: list[float]) -> EditHistory:
    history = EditHistory(clock=lambda: clock[0])
    history.record_edit("geo.py", document_lines(AFTER), 0, 9, "width", "w")
    return history


def predictor(answer: str, **settings: object) -> tuple[NextEditPredictor, ScriptedModel]:
    model = ScriptedModel(rules={"updated/geo.py\n": answer})
    settings = {"screen_below": 0, **settings}  # the model's path; the screen's tests say so
    return NextEditPredictor(model, NextEditSettings.model_validate(settings)), model


def test_a_scripted_rewrite_becomes_the_minimal_edit() -> None:
    clock = [10.0]
    found, model = predictor(PREDICTED + "<|file_sep|>")
    prediction = found.predict(AFTER, "geo.py", (0, 10), recorded(clock))
    assert prediction.reason == "predicted"
    assert [(e.range, e.text) for e in prediction.edits] == [((1, 12, 1, 16), "")]  # "width" -> "w"
    assert prediction.timings.reached_model and len(model.prompts) == 1
    prompt = model.prompts[0]
    assert prompt.startswith("<|file_sep|>geo.py.diff\noriginal:\ndef area(width, height):")
    assert f"<|file_sep|>original/geo.py\n{BEFORE}<|file_sep|>current/geo.py\n{AFTER}" in prompt
    assert prompt.endswith("<|file_sep|>updated/geo.py\n")


def test_no_history_no_recent_edit_or_far_cursor_is_no_change_without_the_model() -> None:
    clock = [10.0]
    found, model = predictor(PREDICTED)
    far = "\n" * 40 + AFTER
    assert found.predict(AFTER, "geo.py", (0, 0), EditHistory()).reason == "no_history"
    history = recorded(clock)
    assert found.predict(far, "geo.py", (40, 0), history).reason == "no_recent_edit"
    assert found.predict(AFTER, "other.py", (0, 0), history).reason == "no_history"
    clock[0] += 61
    assert found.predict(AFTER, "geo.py", (0, 0), history).reason == "no_recent_edit"
    assert model.prompts == []


def test_a_rewrite_that_changes_nothing_is_no_change() -> None:
    found, _ = predictor(AFTER + "<|file_sep|>")
    prediction = found.predict(AFTER, "geo.py", (0, 0), recorded([10.0]))
    assert (prediction.reason, prediction.edits) == ("no_change", [])


def test_a_rewrite_that_undoes_the_last_edit_is_refused() -> None:
    found, _ = predictor(BEFORE + "<|file_sep|>")
    prediction = found.predict(AFTER, "geo.py", (0, 0), recorded([10.0]))
    assert (prediction.reason, prediction.edits) == ("undo", [])


def test_a_rewrite_that_undoes_an_earlier_edit_here_is_refused() -> None:
    # The rename, then after a pause another edit below: the rename is no longer the latest
    # edit, and a rewrite that puts `width` back in the signature still undoes it.
    clock = [10.0]
    history = recorded(clock)
    clock[0] += 5
    later = AFTER.replace('print("width", width)', 'print("width:", width)')
    history.record_edit("geo.py", document_lines(later), 6, 16, "", ":")
    assert len(history.in_document("geo.py")) == 2
    renamed_back = later.replace("def area(w, height)", "def area(width, height)")
    found, _ = predictor(renamed_back + "<|file_sep|>")
    prediction = found.predict(later, "geo.py", (6, 17), history)
    assert (prediction.reason, prediction.edits) == ("undo", [])
    # Carrying the rename through is no undo.
    carried = later.replace("return width * height", "return w * height")
    found, _ = predictor(carried + "<|file_sep|>")
    prediction = found.predict(later, "geo.py", (6, 17), history)
    assert prediction.reason == "predicted"
    assert [(e.range, e.text) for e in prediction.edits] == [((1, 12, 1, 16), "")]


def test_a_rewrite_past_the_window_is_refused() -> None:
    long = AFTER + "".join(f"x{n} = {n}\n" for n in range(30))
    found, _ = predictor("", window_lines=3)
    history = recorded([10.0])
    lines = document_lines(long)
    window_text, next_line = "".join(lines[0:4]), lines[4]  # the cursor's line and 3 below
    found.runner.rules["updated/geo.py\n"] = (  # type: ignore[attr-defined]
        window_text.replace("width * height", "w * height") + next_line
    )
    prediction = found.predict(long, "geo.py", (0, 0), history)
    assert (prediction.reason, prediction.edits) == ("outside_window", [])


def test_a_rewrite_cut_by_its_token_limit_is_refused() -> None:
    found, _ = predictor(PREDICTED + "\n" * 500, margin_tokens=0)
    prediction = found.predict(AFTER, "geo.py", (0, 0), recorded([10.0]))
    assert (prediction.reason, prediction.edits) == ("truncated", [])


def test_a_code_fence_ends_a_rewrite_where_the_window_has_none() -> None:
    # The base model sometimes closes the window as a chat answer: a fence, then prose.
    chat = "```\n\nThis renames the parameter everywhere." + "\n" * 500
    found, _ = predictor(AFTER + chat)  # without the cut, truncated by the 500 breaks
    prediction = found.predict(AFTER, "geo.py", (0, 0), recorded([10.0]))
    assert (prediction.reason, prediction.edits) == ("no_change", [])
    assert prediction.generation is not None
    assert prediction.generation.stop_reason == "stop"  # decoding stopped at the fence
    found.runner.rules["updated/geo.py\n"] = PREDICTED + chat  # type: ignore[attr-defined]
    prediction = found.predict(AFTER, "geo.py", (0, 0), recorded([10.0]))
    assert [(e.range, e.text) for e in prediction.edits] == [((1, 12, 1, 16), "")]


def test_a_fence_stays_text_in_markdown_and_in_windows_that_have_one() -> None:
    assert stop_rule("x = 1\n")("x = 1\n```") == 6
    assert stop_rule("x = 1\n")("```") == 0
    assert stop_rule("x = 1\n")("s = '```'\n") is None  # not at the start of a line
    assert stop_rule("```py\nx = 1\n```\n")("```py\nx = 2\n```\n") is None
    assert stop_rule("x = 1\n", fences_end=False)("x = 1\n```") is None
    assert stop_rule("x = 1\n")("x = 1\n<|file_sep|>```") == 6
    assert not fences_end_rewrites("docs/README.md") and fences_end_rewrites("geo.py")
    assert rewritten_window("x = 2\n```\nprose", "x = 1") == "x = 2"  # no break added
    assert rewritten_window("x = 2\n```\nprose", "x = 1", fences_end=False) == "x = 2\n```\nprose"


def test_a_cancelled_prediction_raises() -> None:
    found, _ = predictor(PREDICTED)
    cancel = CancelToken()
    cancel.cancel("superseded")
    with pytest.raises(Cancelled):
        found.predict(AFTER, "geo.py", (0, 0), recorded([10.0]), cancel)


@dataclass
class DraftModel(ScriptedModel):
    """A scripted model that also decodes with a draft, and remembers the drafts."""

    drafts: list[str] = field(default_factory=list)

    def generate_with_draft(
        self, prompt: str, *, draft: str, max_new_tokens: int, stop: StopRule, cancel: CancelToken
    ) -> Generation:
        self.drafts.append(draft)
        return self.generate(prompt, max_new_tokens=max_new_tokens, stop=stop, cancel=cancel)


def test_a_runner_that_checks_drafts_gets_the_window_as_the_draft() -> None:
    model = DraftModel(rules={"updated/geo.py\n": PREDICTED + "<|file_sep|>"})
    prediction = NextEditPredictor(model).predict(AFTER, "geo.py", (0, 0), recorded([10.0]))
    assert prediction.reason == "predicted"
    assert model.drafts == [AFTER]


def test_a_huge_document_is_read_only_around_the_cursor() -> None:
    counted: list[int] = []

    class Counting(ScriptedModel):
        def count_tokens(self, text: str) -> int:
            counted.append(len(text))
            return super().count_tokens(text)

    body = "value = compute(1, 2, 3)  # filler line\n" * 130_000  # about 5 MB
    text = AFTER + body
    model = Counting(rules={"updated/geo.py\n": PREDICTED + "<|file_sep|>"})
    found = NextEditPredictor(model)
    prediction = found.predict(text, "geo.py", (0, 0), recorded([10.0]))
    assert len(text) > 5_000_000
    assert prediction.window is not None and prediction.window.end <= 11
    assert sum(counted) < 20_000
    assert len(model.prompts[0]) < 10_000
