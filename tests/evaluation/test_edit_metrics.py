"""The next-edit metrics on hand-made points: each figure with a case it would get wrong if it
were computed wrong."""

from __future__ import annotations

import pytest

from evaluation.edits.metrics import (
    PredictionResult,
    changed_lines,
    delta_chrf,
    outcome,
    score,
)
from training.edit_replay import EditPoint, FileChange, ReplayedEdit

BEFORE = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(6))
# Rename f1 (line 2) and its use (line 5): two hunks.
AFTER = BEFORE.replace("def f1(x)", "def g1(x)").replace("return x + 2", "return g1(x) + 2")
CHANGE = FileChange("c0ffee", "m.py", BEFORE, AFTER)


def point(done: int, kind: str) -> EditPoint:
    history = tuple(ReplayedEdit(CHANGE, i) for i in range(done))
    return EditPoint(CHANGE, done, history, kind, (0, 12))  # type: ignore[arg-type]


DUE = point(1, "edit")  # after the rename, before its use is changed
NOT_DUE = point(2, "no_change_after_last")


@pytest.mark.parametrize(
    ("original", "expected", "actual", "low", "high"),
    [
        pytest.param("let x = 42;", "let x = 100;", "let x = 100;", 100, 100, id="right"),
        pytest.param("same text", "same text", "same text", 100, 100, id="nothing-due-none-made"),
        pytest.param(
            "prefix old suffix", "prefix new suffix", "prefix old suffix", 0, 0, id="missed"
        ),
        pytest.param("helloworld", "helloworld", "helloextraworld", 0, 0, id="spurious"),
        # The right place, the wrong text: the deletions match, the insertions do not.
        pytest.param("let x = 42;", "let x = 100;", "let x = 99;", 30, 60, id="half-right"),
        pytest.param("one two three", "one three", "one two four", 10, 40, id="wrong-edit"),
        # Whitespace is not judged.
        pytest.param("a = 1", "a = 2", "a  =  2", 100, 100, id="spacing"),
    ],
)
def test_delta_chrf(original: str, expected: str, actual: str, low: float, high: float) -> None:
    assert low <= delta_chrf(original, expected, actual) <= high


def test_delta_chrf_judges_the_change_not_the_text() -> None:
    # The prediction shares nearly every character with the target (plain chrF would be high),
    # yet makes none of the change: delta-chrF is 0.
    original = "value = compute(first, second)\n" * 5
    expected = original.replace("first", "primary", 1)
    assert delta_chrf(original, expected, original) == 0
    # Recall weighs more than precision (beta = 2): making the change and one more beats
    # making half of it.
    both = delta_chrf(original, expected, expected.replace("second", "other", 1))
    half = delta_chrf(original, expected, original.replace("first", "prim", 1))
    assert both > half


def test_changed_lines_keep_one_shared_line_around_the_change() -> None:
    a, b, c = "1\n2\n3\n4\n5\n", "1\n2\nX\n4\n5\n", "1\n2\n3\n4\n5\n"
    assert changed_lines(a, b, c) == ("2\n3\n4\n", "2\nX\n4\n", "2\n3\n4\n")


def result(predicted: str, ms: float = 10.0, model_ran: bool = True) -> PredictionResult:
    return PredictionResult(predicted, ms, model_ran)


@pytest.mark.parametrize(
    ("at", "predicted", "expected"),
    [
        pytest.param(DUE, AFTER, "exact", id="exact"),
        pytest.param(DUE, DUE.text, "false_no_op", id="false-no-op"),
        pytest.param(DUE, DUE.text.replace("x + 2", "x + 3"), "wrong_edit", id="wrong-edit"),
        pytest.param(NOT_DUE, AFTER, "correct_no_op", id="correct-no-op"),
        pytest.param(NOT_DUE, AFTER.replace("x + 3", "x + 4"), "spurious_edit", id="spurious"),
    ],
)
def test_outcomes(at: EditPoint, predicted: str, expected: str) -> None:
    assert outcome(at, result(predicted)) == expected
    assert outcome(at, PredictionResult(predicted, 1.0, True, error="boom")) == "error"


def test_score_counts_every_figure_on_its_own_points() -> None:
    reverted = DUE.text.replace("def g1(x)", "def f1(x)")  # undoes the rename just made
    points = [DUE, DUE, DUE, NOT_DUE, NOT_DUE, NOT_DUE]
    results = [
        result(AFTER, 900.0),  # exact
        result(reverted, 800.0),  # a reversal (and a wrong edit)
        result(DUE.text, 5.0, model_ran=False),  # false no-op
        result(NOT_DUE.text, 7.0, model_ran=False),  # correct no-op
        result(NOT_DUE.text, 300.0),  # correct no-op, the model ran
        result(NOT_DUE.text.replace("x + 3", "x + 4"), 700.0),  # spurious
    ]
    found = score(points, results)
    assert found["outcomes"] == {
        "exact": 1,
        "wrong_edit": 1,
        "false_no_op": 1,
        "correct_no_op": 2,
        "spurious_edit": 1,
    }
    assert found["edits_due"] == 3
    assert found["exact_match"] == round(3 / 6, 4)  # the exact edit and the two right no-ops
    assert found["exact_match_on_edits"] == round(1 / 3, 4)
    assert found["predicted_edits"] == 3
    assert (found["reversal_count"], found["reversals"]) == (1, round(1 / 3, 4))
    assert found["no_op_accuracy"] == round(2 / 3, 4)
    assert found["false_no_op_rate"] == round(1 / 3, 4)
    # delta-chrF: 100 for the exact edit and the right no-ops, 0 for the missed and spurious.
    assert found["delta_chrf_on_edits"] < found["delta_chrf"] < 100
    latency = found["latency"]
    assert latency["answered_no_change"]["n"] == 3
    assert latency["answered_no_change"]["p50_ms"] == 7.0
    assert latency["answered_edit"]["p50_ms"] == 800.0
    assert latency["model_not_run"] == {"n": 2, "p50_ms": 6.0, "p95_ms": 6.9}
    assert latency["all"]["n"] == 6


def test_errors_are_counted_and_left_out_of_the_figures() -> None:
    found = score([DUE, NOT_DUE], [result(AFTER), PredictionResult("", 1.0, False, "failed")])
    assert found["outcomes"] == {"exact": 1, "error": 1}
    assert found["no_op_accuracy"] is None  # its only point failed
    assert found["latency"]["all"]["n"] == 1


def test_an_edit_the_user_makes_later_in_the_window_is_upcoming_not_exact() -> None:
    # Three hunks: the rename of f1, then its uses in f2 (line 5) and f4 (line 9).
    after = AFTER.replace("return x + 4", "return g1(x) + 4")
    change = FileChange("c0ffee", "m.py", BEFORE, after)
    done = (ReplayedEdit(change, 0),)
    due = EditPoint(change, 1, done, "edit", (0, 12))
    narrow = EditPoint(change, 1, done, "edit", (0, 8))  # the last hunk lies below this window
    now = due.text
    second = now.replace("return x + 2", "return g1(x) + 2")  # the next edit: exact
    third = now.replace("return x + 4", "return g1(x) + 4")  # a later one, shown first
    both = after  # every edit left, at once
    wrong = second.replace("return x + 3", "return g1(x) + 3")  # one edit due, one never made
    assert [len(p.upcoming_hunks()) for p in (due, narrow)] == [2, 1]
    assert [due.is_upcoming(text) for text in (second, third, both, wrong, now)] == [
        True,
        True,
        True,
        False,
        False,
    ]
    assert [narrow.is_upcoming(text) for text in (second, third, both)] == [True, False, False]
    found = score([due] * 5, [result(text) for text in (second, third, both, wrong, now)])
    assert found["outcomes"] == {"exact": 1, "wrong_edit": 3, "false_no_op": 1}
    assert (found["upcoming_match_on_edits"], found["upcoming_not_next"]) == (0.6, 2)
