"""`tabloop eval edits`: next-edit predictions judged on a repository's replayed commit history.

    tabloop eval edits --repo DIR [--commits RANGE | --last N] [--languages IDS] --n N
                       [--seed S] [--adapter PATH [--compare | --baseline-adapter PATH]]
                       [--answers FILE] --json

The commits (`--commits A..B`, or the newest `--last` non-merge commits touching source files:
of every language `common.languages` knows but prose, markup and settings, or of `--languages`)
are replayed as edits (`training.edit_replay`), with the windows the predictor itself would
rewrite (its token budget counted by the model's tokenizer); `--n` points are drawn with the
seed and the configured completion model (default engine, the repository's tabloop
configuration) predicts the next edit at each through `completion.next_edit`
(`evaluation.edits.predicting`), on the runner `nextEdit.engine` resolves to, as the server
would (`completion.next_edit.runner`). The report gives the configuration loaded (engine, weights,
threads, model, adapter, the next-edit settings), the commit range (and, for an adapter trained
by `tabloop train edits`, the range it was trained on, which must be older), the replay's
counts, and the figures of `evaluation.edits.metrics` per run. With `--compare` (or
`--baseline-adapter`) the same points are predicted by the base model (or that adapter) too, and
`paired` gives the differences. `--answers FILE` also writes what was due and what each run
answered at every point (`evaluation.edits.answers`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from common.machine import cpu_description
from completion.next_edit import NextEditPredictor, NextEditSettings
from completion.next_edit.runner import load_next_edit_runner, next_edit_engine
from completion.next_edit.screen import BUNDLED, load_screen
from completion.runners.base import ModelRunner
from completion.settings import CompletionSettings
from evaluation.edits.answers import write_answers
from evaluation.edits.metrics import PredictionResult, outcome, score
from evaluation.edits.predicting import predict_points
from lsp_server import config
from training.edit_examples import read_edit_training
from training.edit_replay import (
    DEFAULT_COMMITS,
    EditPoint,
    GitHistory,
    ReplayError,
    ReplaySettings,
    add_languages_argument,
    files_named,
    language_suffixes,
    languages_replayed,
    replay_commits,
    sample_points,
)
from training.edit_training import token_windows

SEED = 0


def loaded_configuration(
    completion: CompletionSettings, runner: ModelRunner, next_edit: NextEditSettings
) -> dict[str, Any]:
    """What the run loaded: engine, weights, threads, model, adapter, next-edit settings."""
    found: dict[str, Any] = {
        "engine": completion.engine,
        "next_edit_engine": next_edit_engine(next_edit, completion),
        "runner": type(runner).__name__,
        "model": completion.model,
        "model_id": runner.model_id,
        "adapter": completion.adapter or None,
        "next_edit": next_edit.model_dump(),
    }
    if completion.runner == "local":
        from evaluation.bench.engines import loaded_weights

        found.update(loaded_weights(runner))
    if completion.adapter:
        found["adapter_trained_on"] = read_edit_training(Path(completion.adapter))
    if next_edit.screen_below > 0:
        screen = load_screen(next_edit.screen_weights)
        found["screen"] = {
            "file": str(Path(next_edit.screen_weights or BUNDLED)),
            "trained_on": [
                {key: part.get(key) for key in ("repo", "range", "points", "edit_points")}
                for part in screen.trained_on.get("histories", [])
            ],
        }
    return found


def screen_overlap(history: GitHistory, commits: list[str], screen: dict[str, Any]) -> bool:
    """Whether the screen was trained on a range of this repository that reaches the oldest
    commit judged (judging it on commits it saw)."""
    for part in screen.get("trained_on", []):
        if Path(str(part.get("repo"))).resolve() != history.repo:
            continue
        newest = str(part.get("range", "")).rpartition("..")[2]
        done = subprocess.run(
            ["git", "-C", str(history.repo), "merge-base", "--is-ancestor", commits[0], newest],
            capture_output=True,
        )
        if done.returncode == 0:
            return True
    return False


def _load(
    completion: CompletionSettings, next_edit: NextEditSettings, cache_dir: Path
) -> ModelRunner:
    """The runner the server would predict next edits on (only that one is loaded)."""
    from completion.runners import load_runner

    if next_edit_engine(next_edit, completion) == "torch-bfloat16":
        return load_next_edit_runner(completion, cache_dir)
    return load_runner(completion, cache_dir)


def _paired(
    points: list[EditPoint],
    ours: dict[str, Any],
    theirs: dict[str, Any],
    results: dict[str, list[PredictionResult]],
) -> dict[str, Any]:
    """The adapted run against the base one on the same points: the ratios of their exact
    matches on edit points and on all points, the highest all-points ratio any model could
    reach against this base (every point right: 1 / the base's share), and where their
    outcomes differ (`adapted<-base`)."""
    changed: dict[str, int] = {}
    for point, a, b in zip(points, results["adapted"], results["base"], strict=True):
        first, second = outcome(point, a), outcome(point, b)
        if first != second:
            key = f"{first}<-{second}"
            changed[key] = changed.get(key, 0) + 1
    return {
        "exact_match_ratio": _ratio(ours["exact_match_on_edits"], theirs["exact_match_on_edits"]),
        "exact_match_ratio_all_points": _ratio(ours["exact_match"], theirs["exact_match"]),
        "exact_match_ratio_all_points_ceiling": _ratio(1.0, theirs["exact_match"]),
        "points_differing": sum(changed.values()),
        "outcome_changes": dict(sorted(changed.items())),
    }


def _ratio(ours: float, theirs: float) -> float | None:
    """ours / theirs to three places; None where either is 0 (no ratio to speak of)."""
    return round(ours / theirs, 3) if ours and theirs else None


def run_edits(args: argparse.Namespace) -> dict[str, Any]:
    repo = Path(args.repo).resolve()
    try:
        history = GitHistory(repo)
        suffixes = language_suffixes(args.languages)
        commits = history.commits(args.commits, args.last if not args.commits else 0, suffixes)
    except ReplayError as exc:
        raise SystemExit(f"tabloop eval edits: {exc}") from None
    if not commits:
        raise SystemExit(
            f"tabloop eval edits: no commits touching {files_named(args.languages)} in {repo}"
        )
    if args.compare and args.baseline_adapter:
        raise SystemExit("tabloop eval edits: --compare (the base model) or --baseline-adapter")
    if (args.compare or args.baseline_adapter) and not args.adapter:
        raise SystemExit("tabloop eval edits: a comparison needs --adapter")
    if args.answers and Path(args.answers).is_dir():
        raise SystemExit(f"tabloop eval edits: --answers {args.answers} is a directory")
    for adapter in (args.adapter, args.baseline_adapter):
        if adapter and not Path(adapter).is_dir():
            raise SystemExit(f"tabloop eval edits: adapter {adapter} is not a directory")

    resolved = config.resolve(repo)
    settings = resolved.settings
    cache_dir = settings.cache_path()
    next_edit = settings.next_edit
    if args.screen_below is not None:
        next_edit = next_edit.model_copy(update={"screen_below": args.screen_below})
    base = settings.completion
    runs: list[tuple[str, CompletionSettings]] = []
    if args.adapter:
        runs.append(("adapted", base.model_copy(update={"adapter": str(args.adapter)})))
        if args.compare or args.baseline_adapter:
            runs.append(("base", base.model_copy(update={"adapter": args.baseline_adapter or ""})))
    else:
        runs.append(("base", base))

    report: dict[str, Any] = {
        "command": "tabloop eval edits " + " ".join(args.argv),
        "repo": str(repo),
        "head": history.git("rev-parse", "HEAD").strip(),
        "commits": {
            "range": history.describe_range(commits),
            "count": len(commits),
            "first": commits[0],
            "last": commits[-1],
        },
        "seed": args.seed,
        "cpu": cpu_description(),
    }
    points: list[EditPoint] = []
    results: dict[str, list[PredictionResult]] = {}
    for number, (name, completion) in enumerate(runs):
        runner = _load(completion, next_edit, cache_dir)
        try:
            if number == 0:  # the windows are the tokenizer's: the same for every run
                replay = ReplaySettings(window_lines=next_edit.window_lines, suffixes=suffixes)
                found, counts = replay_commits(
                    history, commits, replay, token_windows(runner.count_tokens, next_edit)
                )
                points = sample_points(found, args.n, args.seed)
                report["replay"] = {
                    **counts.summary(),
                    "points_found": len(found),
                    "languages": languages_replayed(args.languages),
                }
                report["points"] = {
                    "n": len(points),
                    "edits_due": sum(1 for p in points if p.expects_change),
                }
                if not points:
                    raise SystemExit(f"tabloop eval edits: no prediction points in {repo}")
            predictor = NextEditPredictor(runner, next_edit)
            shadow = None
            if next_edit.screen_below > 0 and args.unscreened:
                shadow = NextEditPredictor(runner, next_edit.model_copy(update={"screen_below": 0}))
            predicted = predict_points(predictor, points, label=f"{name}", shadow=shadow)
            figures = score(points, predicted.results)
            errors = [r.error for r in predicted.results if r.error]
            report[name] = {
                "configuration": loaded_configuration(completion, runner, next_edit),
                **figures,
                "reasons": dict(sorted(predicted.reasons.items())),
                "model_calls": predictor.model_calls,
                "draft_tokens": predicted.draft_tokens,
                "draft_accepted": predicted.draft_accepted,
                "first_error": errors[0] if errors else None,
            }
            results[name] = predicted.results
            if shadow is not None:
                # The model at every point: the shadow's answer where the screen stopped.
                report[name]["unscreened"] = {
                    **score(points, predicted.unscreened),
                    "reasons": dict(sorted(predicted.unscreened_reasons.items())),
                    "model_calls": predictor.model_calls + shadow.model_calls,
                }
                results[f"{name}_unscreened"] = predicted.unscreened
        finally:
            runner.close()
    if len(runs) == 2:
        report["paired"] = _paired(points, report["adapted"], report["base"], results)
        if "adapted_unscreened" in results and "base_unscreened" in results:
            report["paired_unscreened"] = _paired(
                points,
                report["adapted"]["unscreened"],
                report["base"]["unscreened"],
                {"adapted": results["adapted_unscreened"], "base": results["base_unscreened"]},
            )
    if args.answers:
        answers = Path(args.answers).resolve()
        try:  # the figures are printed even when their answers cannot be kept
            report["answers"] = {
                "file": str(answers),
                "points": write_answers(answers, points, results),
            }
        except OSError as exc:
            report["answers"] = {"file": str(answers), "error": f"{type(exc).__name__}: {exc}"}
    for name, _ in runs:
        trained = report[name]["configuration"].get("adapter_trained_on")
        # Its commits are many: checked here, and only counted in the report.
        if trained and set(trained.pop("commits_list", [])) & set(commits):
            report[name]["warning"] = "the adapter was trained on commits of this range"
        read = (trained or {}).get("history_read")
        if isinstance(read, dict) and isinstance(read.get("keys"), list):
            # Where its chain stands in the history's examples: the lap and how many of it read.
            trained["history_read"] = {"lap": read.get("lap"), "read": len(read["keys"])}
        screen = report[name]["configuration"].get("screen")
        if screen and screen_overlap(history, commits, screen):
            report[name]["screen_warning"] = "the screen was trained on commits of this range"
    return report


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tabloop eval edits", description=__doc__)
    parser.add_argument("--repo", required=True, help="a git repository (a clone with history)")
    parser.add_argument("--commits", help="commit range A..B (default: the newest --last commits)")
    parser.add_argument(
        "--last",
        type=int,
        default=DEFAULT_COMMITS,
        help="the newest non-merge commits touching the languages' files (without --commits)",
    )
    add_languages_argument(parser)
    parser.add_argument("--n", type=int, default=200, help="prediction points to draw")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--adapter", help="adapter directory (e.g. from tabloop train edits)")
    parser.add_argument(
        "--compare", action="store_true", help="also predict with the base model, same points"
    )
    parser.add_argument("--baseline-adapter", help="also predict with this adapter, same points")
    parser.add_argument(
        "--screen-below",
        type=float,
        help="the screen's threshold (default: nextEdit.screenBelow; 0: the model every time)",
    )
    parser.add_argument(
        "--unscreened",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="where the screen answers alone, ask the model too and report both (default: on)",
    )
    parser.add_argument(
        "--answers",
        metavar="FILE",
        help="also write each point's due edit and every run's answer there (JSON Lines)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (the only output form)")
    args = parser.parse_args(argv)
    if args.screen_below is not None and not 0 <= args.screen_below <= 1:
        parser.error("--screen-below must be between 0 and 1")
    if args.n < 1:
        parser.error("--n must be at least 1")
    args.argv = argv
    return args


def main(argv: list[str]) -> int:
    report = run_edits(parse_args(argv))
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0
