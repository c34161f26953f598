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
from training.edit_replay import (
    SOURCE_SUFFIXES,
    EditPoint,
    GitHistory,
    ReplaySettings,
    replay_commits,
)

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
    suffixes: tuple[str, ...] = SOURCE_SUFFIXES,
) -> ScreenRows:
    """Every point of `commits` (oldest first) in files with `suffixes` (default: every source
    language's), with its inputs and label."""
    points, counts = replay_commits(
        history,
        commits,
        ReplaySettings(window_lines=settings.window_lines, suffixes=suffixes),
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
    return judge_chances(probabilities(screen, rows), rows.labels, below)


def judge_chances(found: np.ndarray, labels: np.ndarray, below: float) -> dict[str, Any]:
    """`judge_screen` for a screen's chances `found` at points with `labels`, and the log loss."""
    from sklearn.metrics import log_loss as sklearn_log_loss
    from sklearn.metrics import roc_auc_score

    alone = found < below
    edits, others = labels == 1, labels == 0
    return {
        "points": len(labels),
        "edit_points": int(edits.sum()),
        "auc": round(float(roc_auc_score(labels, found)), 4)
        if edits.any() and others.any()
        else None,
        "log_loss": round(float(sklearn_log_loss(labels, found, labels=[0, 1])), 4)
        if len(labels)
        else None,
        "answered_alone": round(float(alone.mean()), 4) if len(labels) else None,
        "no_change_points_answered_alone": round(float(alone[others].mean()), 4)
        if others.any()
        else None,
        "edit_points_kept_from_model": round(float(alone[edits].mean()), 4)
        if edits.any()
        else None,
    }


# -- would a workspace's own history make a better screen? --------------------------------------

REFIT_MIN_ROWS = 200
"""Points a workspace needs before a screen is refitted on them."""
REFIT_MIN_EACH = 40
"""Of those, the fewest with an edit inside the window, and the fewest without."""
REFIT_HELD_OUT = 0.25
"""The newest share of them, on which the refitted screen and the one in use are judged."""
REFIT_EVERY = 100
"""New points since the last refit that make the next one due."""
REFITS = ("refit", "recalibrate")
"""`refit`: a new screen fitted on the workspace's points alone; `recalibrate`: the screen in use
with its logit rescaled and shifted (two numbers fitted there), which keeps what it learned
elsewhere and corrects its chances for the workspace's rate of edits."""


@dataclass(frozen=True)
class Refit:
    """A refit on a workspace's points: the new screen when it judged better on the newest of
    them than the screen in use (else None), and the report of what was done."""

    screen: EditScreen | None
    report: dict[str, Any]


def logits(screen: EditScreen, features: np.ndarray) -> np.ndarray:
    """The screen's logit at each row of `features` (`probability` before the sigmoid)."""
    weights, mean, scale = (np.array(v) for v in (screen.weights, screen.mean, screen.scale))
    return screen.bias + ((features - mean) / scale) @ weights


def recalibrate(screen: EditScreen, rows: ScreenRows) -> EditScreen:
    """`screen` with its logit rescaled and shifted to fit `rows` (Platt scaling): still a
    linear screen over the same inputs."""
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(C=1e4, max_iter=1000)
    model.fit(logits(screen, rows.features)[:, None], rows.labels)
    a, c = float(model.coef_[0][0]), float(model.intercept_[0])
    return EditScreen(
        tuple(a * w for w in screen.weights),
        a * screen.bias + c,
        screen.mean,
        screen.scale,
        {"recalibrated": dict(screen.trained_on), "on": rows.described, "a": a, "c": c},
    )


def refit_on(rows: ScreenRows, in_use: EditScreen, below: float, kind: str) -> Refit:
    """Refit the screen on a workspace's points (`rows`, oldest first) as `kind` says (`REFITS`):
    on all but the newest `REFIT_HELD_OUT` of them, judged with `in_use` on those newest ones;
    the new screen is kept when its log loss there (a proper score: chances that are right,
    which is what the threshold is applied to) is lower."""
    if kind not in REFITS:
        raise ValueError(f"not a way of refitting: {kind!r} (one of {', '.join(REFITS)})")
    edits = int(rows.labels.sum())
    report: dict[str, Any] = {"examples": len(rows), "edit_examples": edits}
    if len(rows) < REFIT_MIN_ROWS or min(edits, len(rows) - edits) < REFIT_MIN_EACH:
        return Refit(None, report | {"refitted": False, "reason": "too_few_examples"})
    split = len(rows) - round(len(rows) * REFIT_HELD_OUT)
    fitted = ScreenRows(rows.features[:split], rows.labels[:split], {"points": split})
    judged = ScreenRows(rows.features[split:], rows.labels[split:], {})
    if len(set(judged.labels.tolist())) < 2 or len(set(fitted.labels.tolist())) < 2:
        return Refit(None, report | {"refitted": False, "reason": "one_sided_split"})
    new = fit_screen([fitted]) if kind == "refit" else recalibrate(in_use, fitted)
    scores = {
        name: judge_screen(screen, judged, below)
        for name, screen in (("in_use", in_use), ("refitted", new))
    }
    better = scores["refitted"]["log_loss"] < scores["in_use"]["log_loss"]
    report |= {"refitted": True, "adopted": better, "fitted_on": split, "judged_on": len(judged)}
    return Refit(new if better else None, report | scores)


def replay_refits(rows: ScreenRows, start: EditScreen, below: float, kind: str) -> dict[str, Any]:
    """A screen refitted on a workspace's points as they come (`rows`, in the order the
    workspace made them) against `start` kept throughout. Each point is scored by the screen in
    use just before it: `start` until a refit (`refit_on`, due every `REFIT_EVERY` points, on
    all those before the point) judges better. Both are judged on the points after the first
    refit could run (`REFIT_MIN_ROWS`), which neither was fitted on."""
    in_use = start
    fixed, learned = probabilities(start, rows), np.zeros(len(rows))
    refits: list[dict[str, Any]] = []
    last = 0
    for index in range(len(rows)):
        if index - last >= REFIT_EVERY:
            last = index
            seen = ScreenRows(rows.features[:index], rows.labels[:index], {"points": index})
            found = refit_on(seen, in_use, below, kind)
            refits.append({"at": index} | _refit_summary(found.report))
            if found.screen is not None:
                in_use = found.screen
        learned[index] = in_use.probability(dict(zip(FEATURES, rows.features[index], strict=True)))
    later = slice(REFIT_MIN_ROWS, None)
    return {
        "kind": kind,
        "start": judge_chances(fixed[later], rows.labels[later], below),
        "refitted": judge_chances(learned[later], rows.labels[later], below),
        "refits": len(refits),
        "adopted": sum(bool(refit.get("adopted")) for refit in refits),
        "each_refit": refits,
    }


def _refit_summary(report: dict[str, Any]) -> dict[str, Any]:
    if not report.get("refitted"):
        return {"adopted": False, "reason": report.get("reason")}
    return {
        "adopted": report["adopted"],
        "log_loss_in_use": report["in_use"]["log_loss"],
        "log_loss_refitted": report["refitted"]["log_loss"],
    }
