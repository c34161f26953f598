"""Each point of a next-edit evaluation as a record: the edit that was due and what every run
answered there, so a run's figures can be read back to the answers behind them.

    tabloop eval edits ... --answers FILE

writes one JSON object per point, in replay order (JSON Lines):

    {"key": "<commit>:<path>:<hunks done>", "commit": ..., "path": ...,
     "kind": "edit" | "no_change_after_last" | "no_change_outside_window",
     "cursor": [line, character], "window": [start, end],
     "expected": [diff lines],
     "runs": {"adapted": {"outcome": ..., "upcoming": ..., "reason": ..., "model_ran": ...,
                          "latency_ms": ..., "predicted": [diff lines], "error": ...},
              "base": {...}, ...}}

`upcoming` says whether an answer at an edit point made some of the edits the user goes on to
make in the window and nothing else (the next one, a later one, or several; the metric
`upcoming_match_on_edits`). A diff is the lines the answer changes in the file as the user has
it (`line_diff`): `@@` hunk headers with 1-based line numbers, then `-` and `+` lines, no
context; `[]` for no change. Lines are 0-based elsewhere, as in the protocol (`cursor`; `window`
is lines [start, end)). The file holds the point's changes only, never whole files, but those
are the repository's code: it is written where asked and nowhere else.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from completion.next_edit.text import document_lines
from evaluation.edits.metrics import PredictionResult, outcome
from training.edit_replay import EditPoint


def line_diff(before: str, after: str) -> list[str]:
    """What `after` changes in `before`, line by line: a unified diff without context or file
    headers, each line without its line break."""
    lines = difflib.unified_diff(document_lines(before), document_lines(after), n=0, lineterm="")
    return [line.rstrip("\r\n") for line in list(lines)[2:]]


def answer_record(point: EditPoint, results: Mapping[str, PredictionResult]) -> dict[str, Any]:
    """The record of one point: what was due, and each run's answer (`results`, by run)."""
    text = point.text
    return {
        "key": point.key,
        "commit": point.commit,
        "path": point.path,
        "kind": point.kind,
        "cursor": list(point.cursor),
        "window": list(point.window),
        "expected": line_diff(text, point.target),
        "runs": {
            name: {
                "outcome": outcome(point, result),
                "upcoming": point.expects_change and point.is_upcoming(result.predicted),
                "reason": result.reason,
                "model_ran": result.model_ran,
                "latency_ms": round(result.latency_ms, 1),
                "predicted": line_diff(text, result.predicted),
                "error": result.error,
            }
            for name, result in results.items()
        },
    }


def write_answers(
    path: Path, points: Sequence[EditPoint], results: Mapping[str, Sequence[PredictionResult]]
) -> int:
    """Write the record of every point to `path` (JSON Lines); the number written."""
    for name, answers in results.items():
        if len(answers) != len(points):
            raise ValueError(f"run {name} answered {len(answers)} of {len(points)} points")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for number, point in enumerate(points):
            record = answer_record(point, {name: runs[number] for name, runs in results.items()})
            out.write(json.dumps(record, ensure_ascii=False) + "\n")
    return len(points)
