"""Asking a next-edit predictor at replayed points, as the language server would ask it.

For each point the edits of its history are recorded in a fresh `EditHistory` (the server's own,
with its merging and bounds) on a simulated clock (`training.edit_examples.history_at`: a user
moving from one change to the next pauses longer than the history's merge pause), and the
prediction is asked a short pause after the last edit, with the cursor at its end. The answer's
edits are put in the file, so a prediction is judged as the whole file it would leave.

With a `shadow` predictor (the same runner, the screen off), every point the screen answered
alone ("unlikely") is asked of the model too, so one run measures both: what the screened
predictor answered (`results`), and what the model answers at every point (`unscreened`: the
shadow's answer where the screen stopped, else the same answer, which went through the model
in the same way).
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from completion.next_edit import NextEditPrediction, NextEditPredictor
from completion.next_edit.text import document_lines
from completion.types import CancelToken
from evaluation.edits.metrics import PredictionResult
from training.edit_examples import history_at
from training.edit_replay import EditPoint


def predicted_text(text: str, prediction: NextEditPrediction) -> str:
    """The file as the prediction would leave it (as it is for no change)."""
    window = prediction.window
    if not prediction.edits or window is None:
        return text
    lines = document_lines(text)
    return "".join(lines[: window.start]) + prediction.predicted + "".join(lines[window.end :])


@dataclass
class PredictionRun:
    """What one predictor answered at every point, and why (the predictor's reasons)."""

    results: list[PredictionResult] = field(default_factory=list)
    reasons: Counter[str] = field(default_factory=Counter)
    unscreened: list[PredictionResult] = field(default_factory=list)
    unscreened_reasons: Counter[str] = field(default_factory=Counter)
    draft_tokens: int = 0
    draft_accepted: int = 0


def _ask(
    predictor: NextEditPredictor, point: EditPoint
) -> tuple[PredictionResult, NextEditPrediction | None, str]:
    """One prediction at `point`, timed: its result, the prediction, and its reason (`error`
    for a failure, which is counted, not raised)."""
    history, now = history_at(point.history)
    text = point.text
    started = time.perf_counter()
    try:
        prediction = predictor.predict(
            text, point.path, point.cursor, history, CancelToken(), now=now
        )
    except Exception as exc:  # one point's failure is a figure of the run
        elapsed = (time.perf_counter() - started) * 1000
        error = f"{type(exc).__name__}: {exc}"
        return PredictionResult(text, elapsed, False, error, "error"), None, "error"
    elapsed = (time.perf_counter() - started) * 1000
    result = PredictionResult(
        predicted_text(text, prediction),
        elapsed,
        prediction.timings.reached_model,
        reason=prediction.reason,
    )
    return result, prediction, prediction.reason


def predict_points(
    predictor: NextEditPredictor,
    points: Sequence[EditPoint],
    label: str = "",
    shadow: NextEditPredictor | None = None,
) -> PredictionRun:
    """Ask `predictor` at every point (and `shadow` where the screen answered alone)."""
    run = PredictionRun()
    for number, point in enumerate(points, 1):
        result, prediction, reason = _ask(predictor, point)
        run.results.append(result)
        run.reasons[reason] += 1
        if prediction is not None:
            run.draft_tokens += prediction.timings.draft_tokens
            run.draft_accepted += prediction.timings.draft_accepted
        if shadow is not None:
            if reason == "unlikely":
                result, _, reason = _ask(shadow, point)
            run.unscreened.append(result)
            run.unscreened_reasons[reason] += 1
        if label:
            print(f"\r{label}: {number}/{len(points)}", end="", file=sys.stderr, flush=True)
    if label:
        print(file=sys.stderr)
    return run
