"""Is a candidate adapter better than what serves now? Measured on held-out files.

Cursors are cut in the workspace's held-out files (the hash split of `training.examples`, never
trained on) the way training examples are, and both the serving weights (the base model, or the
base model with the serving adapter) and the candidate complete every one through the engine:
exact-line match (the first line right) and edit similarity (1 - Levenshtein / longer length),
with 95% intervals of the paired per-cursor differences, which the registry's promotion rule
reads. Where the feedback store holds accepted suggestions, how often each model reproduces
their first line in the logged context is reported as well (a replay of logged contexts).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common.languages import request_language
from completion.engine import Engine
from completion.runners.torch_runner import TorchRunner
from completion.settings import CompletionSettings
from completion.types import CompletionRequest
from training.examples import FimExample, cut_examples, read_text
from training.feedback import FeedbackStore
from training.window import mark_of


def levenshtein(a: str, b: str) -> int:
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, 1):
        current = [i]
        for j, char_b in enumerate(b, 1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b))
            )
        previous = current
    return previous[-1]


def edit_similarity(suggestion: str, truth: str) -> float:
    longest = max(len(suggestion), len(truth))
    return 1.0 if longest == 0 else 1.0 - levenshtein(suggestion, truth) / longest


def paired(differences: Sequence[float]) -> dict[str, float]:
    """Mean of paired differences with a normal 95% interval."""
    n = len(differences)
    mean = statistics.fmean(differences) if n else 0.0
    spread = statistics.stdev(differences) if n > 1 else 0.0
    half = 1.96 * spread / math.sqrt(n) if n else 0.0
    return {
        "n": n,
        "mean": round(mean, 4),
        "ci95_low": round(mean - half, 4),
        "ci95_high": round(mean + half, 4),
    }


def held_out_cursors(root: Path, files: Sequence[str], n: int, seed: int) -> list[FimExample]:
    """Up to `n` cursors spread over the held-out `files`, the same for the same seed."""
    rng = random.Random(seed)
    pool: list[FimExample] = []
    for rel in sorted(files):
        text = read_text(root, rel)
        if text is not None:
            pool.extend(cut_examples(rel, text, 4 * n, rng))
    return rng.sample(pool, min(n, len(pool)))


def _first_line(text: str) -> str:
    return text.split("\n", 1)[0].strip()


def _scores(example: FimExample, suggestion: str) -> tuple[float, float]:
    exact = float(_first_line(suggestion) == _first_line(example.middle))
    shown = suggestion if example.kind == "block" else suggestion.split("\n", 1)[0]
    return exact, edit_similarity(shown, example.middle)


def request_for(example: FimExample) -> CompletionRequest:
    """The engine's request at an example's cursor, its language the LSP id of its path."""
    return CompletionRequest(
        prefix=example.prefix,
        suffix=example.suffix,
        language=request_language(None, example.path),
        path=example.path,
        trigger="invoked",
    )


def _complete_all(
    engine: Engine, examples: Sequence[FimExample], tick: Callable[[], None]
) -> list[str]:
    texts = []
    for example in examples:
        texts.append(engine.complete(request_for(example)).text)
        tick()
    return texts


def compare(
    runner: TorchRunner,
    settings: CompletionSettings,
    serving: Path | None,
    candidate: Path,
    examples: Sequence[FimExample],
    accepted: Sequence[FimExample] = (),
    tick: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Serving weights against the candidate on the same cursors (the runner ends up serving
    what it served before)."""
    before = runner.adapter
    results: dict[str, list[str]] = {}
    replays: dict[str, list[str]] = {}
    try:
        for name, adapter in (("serving", serving), ("candidate", candidate)):
            runner.swap_adapter(adapter)
            engine = Engine(settings, runner)
            results[name] = _complete_all(engine, examples, tick)
            replays[name] = _complete_all(Engine(settings, runner), accepted, tick)
    finally:
        runner.swap_adapter(before)
    report: dict[str, Any] = {"n": len(examples)}
    per: dict[str, list[tuple[float, float]]] = {
        name: [_scores(e, s) for e, s in zip(examples, texts, strict=True)]
        for name, texts in results.items()
    }
    for name, scores in per.items():
        report[name] = {
            "exact_line_match": round(statistics.fmean(s[0] for s in scores), 4) if scores else 0,
            "edit_similarity": round(statistics.fmean(s[1] for s in scores), 4) if scores else 0,
        }
    pairs = list(zip(per["serving"], per["candidate"], strict=True))
    report["exact_line_difference"] = paired([c[0] - s[0] for s, c in pairs])
    report["edit_similarity_difference"] = paired([c[1] - s[1] for s, c in pairs])
    if accepted:
        report["replay_accepted_first_line"] = {
            name: round(
                statistics.fmean(
                    float(_first_line(t) == _first_line(e.middle))
                    for e, t in zip(accepted, texts, strict=True)
                ),
                4,
            )
            for name, texts in replays.items()
        }
    return report


def accepted_examples(
    store: FeedbackStore | None, train: dict[str, Any], limit: int
) -> list[FimExample]:
    """Up to `limit` of the newest accepted suggestions in the store (the workspace's) that the
    version whose training record is `train` never trained on: those after its mark, which are
    the held-out newest of its window and what came after (`training.window`); oldest first.
    Nothing for a version trained before records held a window (what it saw is not known)."""
    if store is None or "window" not in train or limit <= 0:
        return []
    mark = mark_of(train)
    unseen = sorted(
        (k for k, _ in store.keys(store.last_id()) if mark is None or k > mark), reverse=True
    )
    kept: list[FimExample] = []
    for row in store.rows_by_id(key[1] for key in unseen):
        if row.outcome == "accepted":
            kept.append(FimExample(row.path, row.prefix, row.suggestion, row.suffix, "line"))
            if len(kept) == limit:
                break
    return kept[::-1]
