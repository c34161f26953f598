"""The predictor on a real (tiny) model: its tokenizer, its `<|file_sep|>` stop, its draft."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from completion.next_edit import EditHistory, NextEditPredictor, NextEditSettings
from completion.next_edit.predictor import Reason
from completion.next_edit.text import document_lines
from completion.runners.base import RunnerCapabilities
from completion.runners.torch_runner import TorchRunner
from completion.types import Generation

BEFORE = "def area(width, height):\n    return width * height\n\n\nprint(area(2, 3))\n"
AFTER = BEFORE.replace("area(width, height)", "area(w, height)")
ANSWERS: set[Reason] = {"predicted", "no_change", "empty", "truncated", "outside_window", "undo"}


def test_a_prediction_runs_on_the_tiny_model_with_the_window_as_its_draft(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = TorchRunner(str(tiny_model_path), tmp_path, dtype="float32", reuse_cache=False)
    # The tiny model ends most texts at once; without its end-of-text token it writes on.
    runner._stop_ids = set()
    drafts: list[str] = []
    real = runner.generate_with_draft

    def spy(prompt: str, *, draft: str, **kwargs: Any) -> Generation:
        drafts.append(draft)
        return real(prompt, draft=draft, **kwargs)

    monkeypatch.setattr(runner, "generate_with_draft", spy)
    try:
        assert RunnerCapabilities.of(runner).drafts is not None
        history = EditHistory(clock=lambda: 0.0)
        assert history.record_edit("geo.py", document_lines(AFTER), 0, 9, "width", "w")
        predictor = NextEditPredictor(
            runner, NextEditSettings(window_tokens=128, margin_tokens=8, screen_below=0)
        )
        prediction = predictor.predict(AFTER, "geo.py", (0, 10), history)
    finally:
        runner.close()
    assert prediction.reason in ANSWERS
    assert prediction.window is not None and prediction.window.text == AFTER
    timings = prediction.timings
    assert timings.reached_model and timings.prompt_tokens > timings.window_tokens > 0
    assert 0 < timings.new_tokens <= timings.window_tokens + 8
    assert drafts == [AFTER]  # the window was the draft
    assert "<|file_sep|>" not in prediction.predicted
