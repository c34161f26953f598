"""Refitting the next-edit screen on a workspace's own points (`tabloop eval edit-screen`).

Synthetic points with known chances: whether a refit is kept is decided on the newest points,
by log loss, against the screen in use; the replay scores each point with the screen in use
before it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from completion.next_edit.screen import FEATURES, EditScreen
from training.edit_screen import (
    REFIT_EVERY,
    REFIT_MIN_ROWS,
    ScreenRows,
    judge_screen,
    logits,
    recalibrate,
    refit_on,
    replay_refits,
)

SIZE = len(FEATURES)


def screen(weights: list[float], bias: float = 0.0) -> EditScreen:
    return EditScreen(tuple(weights), bias, (0.0,) * SIZE, (1.0,) * SIZE, {})


def rows_from(truth: EditScreen, count: int, seed: int) -> ScreenRows:
    """`count` points whose labels are drawn with `truth`'s chances."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(count, SIZE))
    chances = 1 / (1 + np.exp(-logits(truth, features)))
    labels = (rng.random(count) < chances).astype(np.int64)
    return ScreenRows(features, labels, {"points": count})


FIRST = screen([2.0] + [0.0] * (SIZE - 1))  # an edit follows where input 0 is high
OTHER = screen([0.0, 2.0] + [0.0] * (SIZE - 2))  # where input 1 is


def test_too_few_points_are_not_refitted() -> None:
    found = refit_on(rows_from(FIRST, REFIT_MIN_ROWS - 1, 0), FIRST, 0.4, "refit")
    assert found.screen is None
    assert found.report["reason"] == "too_few_examples"
    assert found.report["examples"] == REFIT_MIN_ROWS - 1
    with pytest.raises(ValueError, match="not a way of refitting"):
        refit_on(rows_from(FIRST, 10, 0), FIRST, 0.4, "retrain")


def test_a_refit_is_kept_only_where_it_predicts_the_newest_points_better() -> None:
    rows = rows_from(OTHER, 400, 1)
    wrong = refit_on(rows, FIRST, 0.4, "refit")  # the screen in use reads the wrong input
    assert wrong.screen is not None and wrong.report["adopted"]
    assert wrong.report["fitted_on"] == 300 and wrong.report["judged_on"] == 100
    assert wrong.report["refitted"]["log_loss"] < wrong.report["in_use"]["log_loss"]
    assert wrong.screen.weights[1] > 1.0 > abs(wrong.screen.weights[0])
    # The refitted screen's figures are its own on the newest hundred points.
    judged = ScreenRows(rows.features[300:], rows.labels[300:], {})
    assert judge_screen(wrong.screen, judged, 0.4) == wrong.report["refitted"]

    right = refit_on(rows, OTHER, 0.4, "refit")  # the truth itself is not beaten
    assert right.screen is None and right.report["adopted"] is False
    assert right.report["refitted"]["log_loss"] >= right.report["in_use"]["log_loss"]


def test_recalibration_shifts_the_chances_and_keeps_their_order() -> None:
    shifted = screen([2.0] + [0.0] * (SIZE - 1), bias=1.5)  # edits more often than FIRST says
    rows = rows_from(shifted, 2000, 2)
    found = recalibrate(FIRST, rows)
    a, c = found.trained_on["a"], found.trained_on["c"]
    assert a == pytest.approx(1.0, abs=0.2) and c == pytest.approx(1.5, abs=0.3)
    point = dict(zip(FEATURES, rows.features[0], strict=True))
    expected = 1 / (1 + math.exp(-(a * logits(FIRST, rows.features[:1])[0] + c)))
    assert found.probability(point) == pytest.approx(expected)
    order = np.argsort(logits(FIRST, rows.features))
    assert (np.diff(logits(found, rows.features)[order]) >= 0).all()


def test_the_replay_scores_each_point_with_the_screen_in_use_before_it() -> None:
    rows = rows_from(OTHER, 650, 3)
    found = replay_refits(rows, FIRST, 0.4, "refit")
    assert found["refits"] == (650 - 1) // REFIT_EVERY  # due at 100, 200, ..., 600
    assert found["each_refit"][0] == {"at": 100, "adopted": False, "reason": "too_few_examples"}
    assert found["adopted"] >= 1
    later = ScreenRows(rows.features[REFIT_MIN_ROWS:], rows.labels[REFIT_MIN_ROWS:], {})
    assert found["start"] == judge_screen(FIRST, later, 0.4)
    assert found["refitted"]["points"] == 650 - REFIT_MIN_ROWS
    assert found["refitted"]["log_loss"] < found["start"]["log_loss"]

    same = replay_refits(rows, OTHER, 0.4, "recalibrate")  # nothing to correct: kept as is
    assert same["start"]["log_loss"] == pytest.approx(same["refitted"]["log_loss"], abs=0.01)
