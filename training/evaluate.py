"""Is a candidate adapter better than what serves now? Judged on what neither of them wrote.

Both the serving weights (the base model, or the base model with the serving adapter) and the
candidate complete the same cursors, and the candidate's paired per-cursor differences from the
serving weights are reported with 95% intervals:

- **held-out files**: cursors cut in the workspace's held-out files (the hash split of
  `training.examples`, never trained on) the way training examples are; exact-line match (the
  first line right) and edit similarity (1 - Levenshtein / longer length). The registry's
  promotion rule requires the paired exact-line gain's lower bound above its margin here.
- **kept text** (`kept_text`): the held-out accepted and partially accepted suggestions of the
  feedback store, scored against the text the user kept there (`training.feedback`: edits
  included) in the logged context; the same two measures.
- **ignored suggestions** (`ignored_reproduced`): held-out ignored and dismissed suggestions, and
  how often each model writes their first line again in the logged context (lower is better).
- **next edits** (`next_edits`): the held-out next-edit examples the server kept from the user's
  editing (`training.edit_store`; the newest a run could read, held out by
  `training.workspace.live_edit_examples`, less any the serving version trained on); each
  model rewrites the window from the example's prompt, as the predictor does, and scores 1
  where the window it would show (its own rewrite, or the window unchanged when the rewrite
  was cut short or empty) is the text the user settled on: exact window match, and its paired
  difference.

Held-out outcomes are those after the candidate's training mark (`training.window`), so it never
trained on them. Judging runs on the configured engine when it is a fast one (`judging_runner`):
each version is merged and converted once and the conversion is kept, so the version, once
promoted, serves from it; else on the torch runner.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.languages import request_language
from completion.engine import Engine
from completion.next_edit.predictor import fences_end_rewrites, rewrite, rewritten_window
from completion.next_edit.settings import NextEditSettings
from completion.runners.base import ModelRunner, RunnerCapabilities
from completion.runners.converted import ConvertedRunner
from completion.runners.torch_runner import TorchRunner
from completion.settings import CompletionSettings
from completion.types import CompletionRequest
from training.edit_examples import EditExample
from training.edit_store import EditExampleStore
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


@dataclass(frozen=True)
class HeldOutOutcomes:
    """Logged outcomes of the workspace that no judged version trained on, as cursors in their
    logged context: `kept`, whose middle is the text the user kept (the positives), and
    `ignored`, whose middle is a suggestion the user ignored or dismissed (the negatives); and
    `edits`, next-edit examples (the window before and as the user settled it)."""

    kept: tuple[FimExample, ...] = ()
    ignored: tuple[FimExample, ...] = ()
    edits: tuple[EditExample, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.kept or self.ignored or self.edits)


def _rewrite_all(
    runner: ModelRunner, examples: Sequence[EditExample], tick: Callable[[], None]
) -> list[str]:
    """The window each example's rewrite would show: the rewrite, or the window as it is when
    the rewrite ran out of tokens or came back empty (the predictor shows neither)."""
    margin = NextEditSettings().margin_tokens
    shown = []
    for example in examples:
        current = example.current
        budget = runner.count_tokens(current) + margin
        fences = fences_end_rewrites(example.path)
        generation = rewrite(
            runner, example.prompt, current, max_new_tokens=budget, fences_end=fences
        )
        text = rewritten_window(generation.text, current, fences_end=fences)
        cut = generation.stop_reason == "length" or (not text and current)
        shown.append(current if cut else text)
        tick()
    return shown


def _window_matches(examples: Sequence[EditExample], shown: dict[str, list[str]]) -> dict[str, Any]:
    """Each model's exact window match on next-edit `examples` (the window shown is the one the
    user settled on), and the candidate's paired difference from the serving weights."""
    per = {
        name: [float(text == e.target) for e, text in zip(examples, texts, strict=True)]
        for name, texts in shown.items()
    }
    report: dict[str, Any] = {
        "n": len(examples),
        "edits_due": sum(not e.no_change for e in examples),
    }
    for name, hits in per.items():
        report[name] = {"exact_window_match": round(statistics.fmean(hits), 4) if hits else 0}
    report["exact_window_difference"] = paired(
        [c - s for s, c in zip(per["serving"], per["candidate"], strict=True)]
    )
    return report


def _matches(examples: Sequence[FimExample], texts: dict[str, list[str]]) -> dict[str, Any]:
    """Each model's exact-line match and edit similarity on `examples`, and the candidate's
    paired differences from the serving weights."""
    per = {
        name: [_scores(e, s) for e, s in zip(examples, completions, strict=True)]
        for name, completions in texts.items()
    }
    report: dict[str, Any] = {"n": len(examples)}
    for name, scores in per.items():
        report[name] = {
            "exact_line_match": round(statistics.fmean(s[0] for s in scores), 4) if scores else 0,
            "edit_similarity": round(statistics.fmean(s[1] for s in scores), 4) if scores else 0,
        }
    pairs = list(zip(per["serving"], per["candidate"], strict=True))
    report["exact_line_difference"] = paired([c[0] - s[0] for s, c in pairs])
    report["edit_similarity_difference"] = paired([c[1] - s[1] for s, c in pairs])
    return report


def _reproduced(examples: Sequence[FimExample], texts: dict[str, list[str]]) -> dict[str, Any]:
    """How often each model writes the first line of an ignored suggestion again (lower is
    better), and the candidate's paired difference from the serving weights."""
    per = {
        name: [
            float(_first_line(t) == _first_line(e.middle))
            for e, t in zip(examples, completions, strict=True)
        ]
        for name, completions in texts.items()
    }
    report: dict[str, Any] = {"n": len(examples)}
    for name, hits in per.items():
        report[name] = round(statistics.fmean(hits), 4) if hits else 0
    report["difference"] = paired(
        [c - s for s, c in zip(per["serving"], per["candidate"], strict=True)]
    )
    return report


def engine_name(runner: ModelRunner) -> str:
    """The engine a runner completes with: `onnxruntime`, `ctranslate2` or `torch`."""
    return runner.ENGINE if isinstance(runner, ConvertedRunner) else "torch"


def compare(
    runner: ModelRunner,
    settings: CompletionSettings,
    serving: Path | None,
    candidate: Path,
    examples: Sequence[FimExample],
    outcomes: HeldOutOutcomes = HeldOutOutcomes(),
    tick: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Serving weights against the candidate on the same cursors (the runner ends up serving
    what it served before): the held-out files' `examples`, and the held-out `outcomes` (under
    `kept_text` and `ignored_reproduced`). The runner swaps adapters: on a fast engine each
    version is merged and converted once (cached per version). `seconds` says how long each
    version took to get ready and to complete everything."""
    adapters = RunnerCapabilities.of(runner).adapters
    if adapters is None:
        raise ValueError(f"the {engine_name(runner)} runner does not serve adapters")
    before = adapters.adapter
    sets = {"files": list(examples), "kept": list(outcomes.kept), "ignored": list(outcomes.ignored)}
    texts: dict[str, dict[str, list[str]]] = {name: {} for name in sets}
    windows: dict[str, list[str]] = {}
    seconds: dict[str, dict[str, float]] = {}
    try:
        for name, adapter in (("serving", serving), ("candidate", candidate)):
            started = time.perf_counter()
            adapters.swap_adapter(adapter)
            ready = time.perf_counter()
            for kind, cursors in sets.items():
                texts[kind][name] = _complete_all(Engine(settings, runner), cursors, tick)
            windows[name] = _rewrite_all(runner, outcomes.edits, tick)
            seconds[name] = {
                "ready_s": round(ready - started, 1),
                "completing_s": round(time.perf_counter() - ready, 1),
            }
    finally:
        adapters.swap_adapter(before)
    report = _matches(examples, texts["files"])
    report["engine"] = engine_name(runner)
    # Where judging's time went: making each version ready (on a fast engine, the first time,
    # merging and converting it) and completing every cursor with it.
    report["seconds"] = seconds
    if outcomes.kept:
        report["kept_text"] = _matches(outcomes.kept, texts["kept"])
    if outcomes.ignored:
        report["ignored_reproduced"] = _reproduced(outcomes.ignored, texts["ignored"])
    if outcomes.edits:
        report["next_edits"] = _window_matches(outcomes.edits, windows)
    return report


def held_out_outcomes(
    store: FeedbackStore | None, train: dict[str, Any], limit: int
) -> HeldOutOutcomes:
    """Up to `limit` each of the newest kept texts and ignored or dismissed suggestions in the
    store (the workspace's) that the version whose training record is `train` never trained on:
    those after its mark, which are the held-out newest of its window and what came after
    (`training.window`); oldest first. A kept text is the row's (accepted or partially
    accepted); an accepted row from before rows kept it stands for itself. Nothing for a
    version trained before records held a window (what it saw is not known)."""
    if store is None or "window" not in train or limit <= 0:
        return HeldOutOutcomes()
    mark = mark_of(train)
    unseen = sorted(
        (k for k, _ in store.keys(store.last_id()) if mark is None or k > mark), reverse=True
    )
    kept: list[FimExample] = []
    ignored: list[FimExample] = []
    for row in store.rows_by_id(key[1] for key in unseen):
        text = row.kept if row.kept is not None or row.outcome != "accepted" else row.suggestion
        if row.outcome in ("accepted", "partial") and text and len(kept) < limit:
            kind = "block" if "\n" in text.strip("\n") else "line"
            kept.append(FimExample(row.path, row.prefix, text, row.suffix, kind))
        elif row.outcome in ("ignored", "dismissed") and len(ignored) < limit:
            ignored.append(FimExample(row.path, row.prefix, row.suggestion, row.suffix, "line"))
        if len(kept) == len(ignored) == limit:
            break
    return HeldOutOutcomes(tuple(kept[::-1]), tuple(ignored[::-1]))


def held_out_edits(
    store: EditExampleStore | None,
    train: dict[str, Any],
    serving_train: dict[str, Any] | None,
    limit: int,
) -> tuple[EditExample, ...]:
    """Up to `limit` of the newest next-edit examples that the version whose training record is
    `train` held out and the serving version (`serving_train`; None: the base model) never
    trained on; newest first. None for a version that held none out."""
    mine = train.get("edit_examples") or {}
    if store is None or limit <= 0 or not mine.get("held_out"):
        return ()
    seen = max(int(mine["trained_through_id"]), _edits_trained_through(serving_train))
    return tuple(store.examples(int(mine["upto_id"]), after_id=seen)[:limit])


def _edits_trained_through(train: dict[str, Any] | None) -> int:
    """The newest next-edit example a version may have trained on (0: none)."""
    edits = (train or {}).get("edit_examples") or {}
    if not edits:
        return 0
    # A version from before runs held examples out read every one it could, up to an id its
    # record does not say: none is taken as unseen by it.
    return int(edits.get("trained_through_id", 2**62))


def judging_cost(engine: str, seconds: float, train: dict[str, Any]) -> dict[str, Any]:
    """What judging a version cost: the engine that judged, the seconds it took (loading,
    merging and converting, completing), and those against the seconds its training took
    (`train`: its training record)."""
    training = float(train.get("elapsed_s") or 0.0)
    return {
        "engine": engine,
        "seconds": round(seconds, 1),
        "training_s": round(training, 1),
        "share_of_training": round(seconds / training, 3) if training > 0 else None,
    }


def judging_runner(settings: CompletionSettings, cache_dir: Path) -> ModelRunner:
    """The runner that judges, on the base weights: the configured engine when it is a fast one
    (`completion.engine`, ONNX Runtime GenAI by default), which merges and converts each judged
    version once and keeps the conversion, so a promoted version serves from it; otherwise (the
    torch engine, an HTTP runner, a fast engine that cannot load) the torch runner in float32."""
    local = settings.model_copy(update={"adapter": "", "runner": "local"})
    if settings.runner == "local" and settings.engine != "torch":
        from completion.runners import load_runner

        runner = load_runner(local, cache_dir)
        if RunnerCapabilities.of(runner).adapters is not None:
            return runner
        runner.close()
    return TorchRunner(settings.model, cache_dir, dtype="float32")
