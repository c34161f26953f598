"""Asking a next-edit predictor at replayed points, as the language server would ask it.

For each point the edits of its history are recorded in a fresh `EditHistory` (the server's own,
with its merging and bounds) on a simulated clock (`training.edit_examples.history_at`: a user
moving from one change to the next pauses longer than the history's merge pause), and the
prediction is asked a short pause after the last edit, with the cursor at its end. The answer's
edits are put in the file, so a prediction is judged as the whole file it would leave.
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
    draft_tokens: int = 0
    draft_accepted: int = 0


def predict_points(
    predictor: NextEditPredictor, points: Sequence[EditPoint], label: str = ""
) -> PredictionRun:
    """Ask `predictor` at every point; a failure is counted as the point's error, not raised."""
    run = PredictionRun()
    for number, point in enumerate(points, 1):
        history, now = history_at(point.history)
        text = point.text
        started = time.perf_counter()
        try:
            prediction = predictor.predict(
                text, point.path, point.cursor, history, CancelToken(), now=now
            )
        except Exception as exc:  # one point's failure is a figure of the run
            elapsed = (time.perf_counter() - started) * 1000
            run.results.append(
                PredictionResult(text, elapsed, False, f"{type(exc).__name__}: {exc}")
            )
            run.reasons["error"] += 1
            continue
        elapsed = (time.perf_counter() - started) * 1000
        timings = prediction.timings
        run.results.append(
            PredictionResult(predicted_text(text, prediction), elapsed, timings.reached_model)
        )
        run.reasons[prediction.reason] += 1
        run.draft_tokens += timings.draft_tokens
        run.draft_accepted += timings.draft_accepted
        if label:
            print(f"\r{label}: {number}/{len(points)}", end="", file=sys.stderr, flush=True)
    if label:
        print(file=sys.stderr)
    return run
