"""How good next-edit predictions are, on the points of a replayed history.

- `exact_match`: the predicted file is the target exactly (the window is right and nothing outside
  it moved); also on the points where an edit was due (`exact_match_on_edits`).
- `upcoming_match_on_edits`: of the points where an edit was due, the share answered with some
  of the edits the user goes on to make inside the window in the same commit and nothing else
  (`training.edit_replay.EditPoint.is_upcoming`): the next edit (an exact match), a later one
  shown before it, or several at once. `upcoming_not_next` counts those that are not exact.
- `delta_chrf`: chrF (Popović 2015) of the *changes*, not of the texts, as Zed's edit-prediction
  evaluation defines it: for each character n-gram order 1..6, the n-gram counts of the text
  before are subtracted from those of the expected text and from those of the predicted text;
  a negative count becomes a count of a "removed n-gram" token, so deleting the wrong text is a
  false positive and failing to delete is a false negative. Precision and recall are averaged over
  the orders (an order where neither side changes anything counts as 1 and 1) and combined as
  F-beta with beta = 2 (recall weighs more), whitespace ignored, 0..100. A prediction of no change
  where an edit was due scores 0; no change where none was due scores 100.
- `reversals`: the share of predicted edits that undo one of the point's recent edits
  (`completion.next_edit.diff.reverts`, which also keeps the server from showing them).
- `no_op_accuracy`: of the points where no edit follows inside the window, the share answered
  with no change; `false_no_op_rate`: of the points where one does, the share answered with none.
- latency p50/p95 of every prediction, of those answered with no change and of those answered
  with an edit, and of those where the model ran and where it did not.
- `outcomes`: every point counted by what happened (exact, wrong_edit, false_no_op,
  correct_no_op, spurious_edit, error).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from completion.next_edit.diff import reverts
from completion.next_edit.text import lines_of
from training.edit_replay import EditPoint

CHRF_ORDER = 6
CHRF_BETA = 2.0


def _ngram_counts(text: str, order: int) -> Counter[str]:
    return Counter(text[i : i + order] for i in range(len(text) - order + 1))


def _delta_counts(after: Counter[str], before: Counter[str]) -> Counter[str]:
    """The change of counts as positive counts: added n-grams, and removed ones marked `-`."""
    delta: Counter[str] = Counter()
    for gram in after.keys() | before.keys():
        change = after[gram] - before[gram]
        if change > 0:
            delta[gram] = change
        elif change < 0:
            delta["-" + gram] = -change
    return delta


def delta_chrf(original: str, expected: str, actual: str) -> float:
    """chrF (0..100) between the change original -> expected and the change original -> actual."""
    texts = ["".join(text.split()) for text in (original, expected, actual)]
    if texts[0] == texts[1] == texts[2]:
        return 100.0
    precision = recall = 0.0
    for order in range(1, CHRF_ORDER + 1):
        before, wanted, got = (_ngram_counts(text, order) for text in texts)
        expected_delta = _delta_counts(wanted, before)
        actual_delta = _delta_counts(got, before)
        if not expected_delta and not actual_delta:
            precision += 1.0
            recall += 1.0
            continue
        hits = sum((expected_delta & actual_delta).values())
        predicted, due = sum(actual_delta.values()), sum(expected_delta.values())
        precision += hits / predicted if predicted else 0.0
        recall += hits / due if due else 0.0
    precision /= CHRF_ORDER
    recall /= CHRF_ORDER
    if precision + recall == 0:
        return 0.0
    beta2 = CHRF_BETA**2
    return 100.0 * (1 + beta2) * precision * recall / (beta2 * precision + recall)


def changed_lines(*texts: str) -> tuple[str, ...]:
    """The texts less the lines all of them share at the start and at the end (delta-chrF only
    depends on the n-grams near a change, so scoring the region is scoring the file)."""
    split = [lines_of(text) for text in texts]
    head = 0
    while all(head < len(lines) for lines in split) and len({lines[head] for lines in split}) == 1:
        head += 1
    tail = 0
    while (
        all(tail < len(lines) - head for lines in split)
        and len({lines[len(lines) - 1 - tail] for lines in split}) == 1
    ):
        tail += 1
    # One shared line either side keeps the n-grams that cross a changed region's edges.
    head, tail = max(head - 1, 0), max(tail - 1, 0)
    return tuple("".join(lines[head : len(lines) - tail]) for lines in split)


@dataclass(frozen=True)
class PredictionResult:
    """What the predictor answered at one point: the whole file after its edits (the text as it
    was for no change), how long it took, and whether the model ran."""

    predicted: str
    latency_ms: float
    model_ran: bool
    error: str | None = None
    reason: str = ""  # the predictor's reason (`error` for a failure)


def outcome(point: EditPoint, result: PredictionResult) -> str:
    """What happened at a point: exact, wrong_edit, false_no_op, correct_no_op, spurious_edit,
    or error."""
    if result.error is not None:
        return "error"
    no_change = result.predicted == point.text
    if point.expects_change:
        if result.predicted == point.target:
            return "exact"
        return "false_no_op" if no_change else "wrong_edit"
    return "correct_no_op" if no_change else "spurious_edit"


def _share(hits: int, total: int) -> float | None:
    return round(hits / total, 4) if total else None


def latency(values: Sequence[float]) -> dict[str, Any]:
    """Count, p50 and p95 (milliseconds) of `values`."""
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered), 1) if ordered else None,
        "p95_ms": round(statistics.quantiles(ordered, n=20, method="inclusive")[-1], 1)
        if len(ordered) > 1
        else (round(ordered[0], 1) if ordered else None),
    }


def score(points: Sequence[EditPoint], results: Sequence[PredictionResult]) -> dict[str, Any]:
    """Every figure of the module docstring, over `points` and what was predicted at them."""
    rows = list(zip(points, results, strict=True))
    outcomes = Counter(outcome(p, r) for p, r in rows)
    answered = [(p, r) for p, r in rows if r.error is None]
    due = [(p, r) for p, r in answered if p.expects_change]
    not_due = [(p, r) for p, r in answered if not p.expects_change]
    edits = [(p, r) for p, r in answered if r.predicted != p.text]
    chrf = [delta_chrf(*changed_lines(p.text, p.target, r.predicted)) for p, r in answered]
    chrf_due = [delta_chrf(*changed_lines(p.text, p.target, r.predicted)) for p, r in due]
    reversals = sum(1 for p, r in edits if reverts(p.text, r.predicted, p.history))
    upcoming = [r.predicted == p.target or p.is_upcoming(r.predicted) for p, r in due]
    return {
        "n": len(rows),
        "edits_due": sum(1 for p, _ in rows if p.expects_change),
        "outcomes": dict(sorted(outcomes.items())),
        "exact_match": _share(outcomes["exact"] + outcomes["correct_no_op"], len(rows)),
        "exact_match_on_edits": _share(outcomes["exact"], len(due)),
        "upcoming_match_on_edits": _share(sum(upcoming), len(due)),
        "upcoming_not_next": sum(upcoming) - outcomes["exact"],
        "delta_chrf": round(statistics.fmean(chrf), 2) if chrf else None,
        "delta_chrf_on_edits": round(statistics.fmean(chrf_due), 2) if chrf_due else None,
        "predicted_edits": len(edits),
        "reversals": _share(reversals, len(edits)),
        "reversal_count": reversals,
        "no_op_accuracy": _share(outcomes["correct_no_op"], len(not_due)),
        "false_no_op_rate": _share(outcomes["false_no_op"], len(due)),
        "latency": {
            "all": latency([r.latency_ms for _, r in answered]),
            "answered_no_change": latency(
                [r.latency_ms for p, r in answered if r.predicted == p.text]
            ),
            "answered_edit": latency([r.latency_ms for _, r in edits]),
            "model_ran": latency([r.latency_ms for _, r in answered if r.model_ran]),
            "model_not_run": latency([r.latency_ms for _, r in answered if not r.model_ran]),
        },
    }
