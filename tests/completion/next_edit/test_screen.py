"""The screen: its inputs read from what a prediction sees, its file, and the predictor asking
the model only above its threshold."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from completion.next_edit import EditHistory, NextEditPredictor, NextEditSettings
from completion.next_edit.prompt import choose_window
from completion.next_edit.screen import (
    BUNDLED,
    FEATURES,
    EditScreen,
    ScreenError,
    load_screen,
    screen_features,
)
from completion.next_edit.text import document_lines
from tests.completion.next_edit.test_predictor import AFTER
from tests.support.scripted_model import ScriptedModel


# The user renamed `width` to `w` on the first line; its uses below are left to rename.
def renamed() -> EditHistory:
    history = EditHistory(clock=lambda: 10.0)
    history.record_edit("geo.py", document_lines(AFTER), 0, 9, "width", "w")
    return history


def features_at(text: str, history: EditHistory, line: int, radius: int = 10) -> dict[str, float]:
    lines = document_lines(text)
    window = choose_window(
        lines, line, radius=radius, max_tokens=256, count_tokens=lambda s: len(s.split())
    )
    assert window is not None
    latest = history.latest("geo.py")
    assert latest is not None
    return screen_features(lines, window, line, latest, history.events())


def test_a_rename_not_carried_through_is_read_from_the_window() -> None:
    found = features_at(AFTER, renamed(), 0)
    assert list(found) == list(FEATURES)
    # "width" left the edited line and is still used below it, in the window.
    assert found["removed_names_in_window"] == math.log1p(1)
    assert found["removed_names"] == math.log1p(1)
    assert found["inserted_names_in_window"] == 0  # "w" is nowhere else
    assert (found["removed_lines"], found["inserted_lines"]) == (math.log1p(1), math.log1p(1))
    assert (found["pure_insertion"], found["pure_deletion"]) == (0.0, 0.0)
    # "def show(width, height):" is like the line the edit changed.
    assert found["similar_lines"] == math.log1p(1)
    assert found["lines_above"] == 0 and found["lines_below"] == math.log1p(7)
    assert found["end_in_window"] == 1.0
    assert found["events_here"] == math.log1p(1)

    # Carried through, the name is gone from the window: nothing left to rename.
    done = AFTER.replace("width", "w")
    history = EditHistory(clock=lambda: 10.0)
    history.record_edit("geo.py", document_lines(done), 0, 9, "width", "w")
    assert features_at(done, history, 0)["removed_names_in_window"] == 0


def test_lines_like_the_edited_one_count_as_a_repeated_pattern() -> None:
    before = "".join(f"    self.{name} = kwargs.get('{name}')\n" for name in "abcd")
    after = before.replace("kwargs.get('a')", "kwargs.pop('a')")
    history = EditHistory(clock=lambda: 10.0)
    history.record_edit("geo.py", document_lines(after), 0, 13, "kwargs.get", "kwargs.pop")
    found = features_at(after, history, 0)
    assert found["similar_lines"] == math.log1p(3)  # b, c and d still read kwargs.get
    assert found["end_in_window"] == 1.0
    # A window that stops short of the document's end says so.
    long = after + "x = 1\n" * 30
    assert features_at(long, history, 0, radius=3)["end_in_window"] == 0.0


def screen_with(bias: float) -> EditScreen:
    n = len(FEATURES)
    return EditScreen((0.0,) * n, bias, (0.0,) * n, (1.0,) * n, {"histories": []})


def test_a_screen_file_round_trips_and_bad_ones_are_clear_errors(tmp_path: Path) -> None:
    screen = EditScreen(
        tuple(float(i) for i in range(len(FEATURES))),
        -0.5,
        (0.1,) * len(FEATURES),
        (2.0,) * len(FEATURES),
        {"points": 3},
    )
    path = tmp_path / "screen.json"
    path.write_text(json.dumps(screen.to_json()), encoding="utf-8")
    assert EditScreen.read(path) == screen
    assert load_screen(str(path)) == screen
    # The command's whole report is accepted too (its `screen` part is read).
    path.write_text(json.dumps({"command": "x", "screen": screen.to_json()}), encoding="utf-8")
    assert EditScreen.read(path) == screen

    body = screen.to_json()
    for broken, message in [
        ({**body, "format": "other"}, "not a tabloop.edit-screen/1"),
        ({**body, "features": body["features"][:-1]}, "features are not"),
        ({**body, "weights": body["weights"][:-1]}, "needs 15 weights"),
        ({**body, "scale": [0.0] * len(FEATURES)}, "scales positive"),
        ({**body, "bias": "high"}, "missing or wrong"),
    ]:
        path.write_text(json.dumps(broken), encoding="utf-8")
        with pytest.raises(ScreenError, match=message):
            EditScreen.read(path)
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(ScreenError, match="cannot read"):
        EditScreen.read(path)
    with pytest.raises(ScreenError, match="cannot read"):
        EditScreen.read(tmp_path / "missing.json")


def test_the_bundled_screen_favours_the_rename_over_an_edit_that_left_nothing() -> None:
    screen = load_screen()
    assert screen == EditScreen.read(BUNDLED)
    assert [part["range"] for part in screen.trained_on["histories"]]  # says what it read
    rename = screen.probability(features_at(AFTER, renamed(), 0))
    done = AFTER.replace("width", "w")
    history = EditHistory(clock=lambda: 10.0)
    history.record_edit("geo.py", document_lines(done), 0, 9, "width", "w")
    carried = screen.probability(features_at(done, history, 0))
    assert 0 < carried < rename < 1


def predictor_with(screen: EditScreen | None, tmp_path: Path, below: float = 0.5) -> tuple:
    model = ScriptedModel(rules={"updated/geo.py\n": AFTER + "<|file_sep|>"})
    settings: dict[str, object] = {"screen_below": below if screen else 0}
    if screen is not None:
        path = tmp_path / "screen.json"
        path.write_text(json.dumps(screen.to_json()), encoding="utf-8")
        settings["screen_weights"] = str(path)
    return NextEditPredictor(model, NextEditSettings.model_validate(settings)), model


def test_below_the_threshold_the_answer_is_no_change_without_the_model(tmp_path: Path) -> None:
    found, model = predictor_with(screen_with(-5.0), tmp_path)
    prediction = found.predict(AFTER, "geo.py", (0, 10), renamed())
    assert (prediction.reason, prediction.edits) == ("unlikely", [])
    assert prediction.screen is not None and prediction.screen < 0.01
    assert not prediction.timings.reached_model and model.prompts == []
    assert prediction.window is not None and prediction.window.start == 0

    (tmp_path / "high").mkdir()
    found, model = predictor_with(screen_with(5.0), tmp_path / "high")
    prediction = found.predict(AFTER, "geo.py", (0, 10), renamed())
    assert prediction.reason == "no_change" and prediction.timings.reached_model
    assert prediction.screen is not None and prediction.screen > 0.99
    assert len(model.prompts) == 1

    # Threshold 0: the model decides, and the screen is not read.
    found, model = predictor_with(None, tmp_path)
    prediction = found.predict(AFTER, "geo.py", (0, 10), renamed())
    assert prediction.screen is None and len(model.prompts) == 1


def test_a_screen_file_that_cannot_be_read_fails_the_prediction_clearly(tmp_path: Path) -> None:
    model = ScriptedModel(rules={"": AFTER})
    settings = NextEditSettings(screen_weights=str(tmp_path / "missing.json"))
    with pytest.raises(ScreenError, match="cannot read the screen"):
        NextEditPredictor(model, settings).predict(AFTER, "geo.py", (0, 10), renamed())
