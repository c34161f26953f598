"""Training the next-edit screen (`completion.next_edit.screen`) on replayed histories.

Each point of a replay (`training.edit_replay`) is what a prediction would see: the history
recorded in the server's own `EditHistory` (`training.edit_examples.history_at`), the window the
predictor itself chooses (its token budget counted by the model's tokenizer), the cursor. Its
label is whether the next edit lies inside that window (an `edit` point). The screen is a
logistic regression (scikit-learn's, on standardised inputs) of the label on
`screen_features`; no model runs, so a history of hundreds of commits takes seconds.

`judge_screen` reads the same figures on other points (newer commits): the ROC AUC, and at a
threshold the share of points the screen answers alone, of the no-change points among them and
of the edit points it would keep from the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from completion.next_edit import NextEditSettings
from completion.next_edit.prompt import settings_window
from completion.next_edit.screen import FEATURES, EditScreen, screen_features
from completion.next_edit.text import document_lines
from training.edit_examples import history_at, token_windows
from training.edit_replay import EditPoint, GitHistory, ReplaySettings, replay_commits

REGULARISATION = 1.0
"""scikit-learn's C (inverse L2 strength) on standardised inputs."""


@dataclass
class ScreenRows:
    """The points of some replayed commits as the screen reads them: inputs and labels."""

    features: np.ndarray  # points x FEATURES
    labels: np.ndarray  # 1 where the next edit lies inside the window
    described: dict[str, Any]  # the repository, range and replay counts

    def __len__(self) -> int:
        return len(self.labels)


def point_features(
    point: EditPoint, count_tokens: Callable[[str], int], settings: NextEditSettings
) -> list[float] | None:
    """The screen's inputs at `point`, as the predictor computes them (None: no window)."""
    history, _ = history_at(point.history)
    latest = history.latest(point.path)
    if latest is None:
        return None
    lines = document_lines(point.text)
    line = point.cursor[0]
    window = settings_window(lines, line, settings, count_tokens)
    if window is None:
        return None
    found = screen_features(lines, window, line, latest, history.events())
    return [found[name] for name in FEATURES]


def screen_rows(
    history: GitHistory,
    commits: Sequence[str],
    count_tokens: Callable[[str], int],
    settings: NextEditSettings,
) -> ScreenRows:
    """Every point of `commits` (oldest first) with its inputs and label."""
    points, counts = replay_commits(
        history,
        commits,
        ReplaySettings(window_lines=settings.window_lines),
        token_windows(count_tokens, settings),
    )
    rows, labels = [], []
    for point in points:
        found = point_features(point, count_tokens, settings)
        if found is not None:
            rows.append(found)
            labels.append(int(point.expects_change))
    return ScreenRows(
        np.array(rows, dtype=np.float64).reshape(len(rows), len(FEATURES)),
        np.array(labels, dtype=np.int64),
        {
            "repo": str(history.repo),
            "range": history.describe_range(commits),
            "commit_count": len(commits),
            "replay": counts.summary(),
            "points": len(labels),
            "edit_points": int(sum(labels)),
        },
    )


def fit_screen(parts: Sequence[ScreenRows]) -> EditScreen:
    """A logistic screen fitted on all of `parts`, saying what it was trained on."""
    from sklearn.linear_model import LogisticRegression

    features = np.vstack([part.features for part in parts])
    labels = np.concatenate([part.labels for part in parts])
    if len(set(labels.tolist())) < 2:
        raise ValueError("the screen needs points with and without a following edit")
    mean = features.mean(axis=0)
    scale = features.std(axis=0)
    scale[scale == 0] = 1.0
    model = LogisticRegression(C=REGULARISATION, max_iter=1000)
    model.fit((features - mean) / scale, labels)
    return EditScreen(
        tuple(float(w) for w in model.coef_[0]),
        float(model.intercept_[0]),
        tuple(float(m) for m in mean),
        tuple(float(s) for s in scale),
        {"histories": [part.described for part in parts], "points": len(labels)},
    )


def probabilities(screen: EditScreen, rows: ScreenRows) -> np.ndarray:
    return np.array(
        [screen.probability(dict(zip(FEATURES, row, strict=True))) for row in rows.features]
    )


def judge_screen(screen: EditScreen, rows: ScreenRows, below: float) -> dict[str, Any]:
    """How the screen does on `rows` at the threshold `below`: the ROC AUC and what it answers
    alone (its "no change" without the model)."""
    from sklearn.metrics import roc_auc_score

    found = probabilities(screen, rows)
    labels = rows.labels
    alone = found < below
    edits, others = labels == 1, labels == 0
    return {
        "points": len(rows),
        "edit_points": int(edits.sum()),
        "auc": round(float(roc_auc_score(labels, found)), 4)
        if edits.any() and others.any()
        else None,
        "answered_alone": round(float(alone.mean()), 4) if len(rows) else None,
        "no_change_points_answered_alone": round(float(alone[others].mean()), 4)
        if others.any()
        else None,
        "edit_points_kept_from_model": round(float(alone[edits].mean()), 4)
        if edits.any()
        else None,
    }
