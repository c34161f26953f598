"""`tabloop train edits`: a next-edit adapter trained on a repository's older commits.

    tabloop train edits --repo DIR [--commits RANGE | --before REV --last N] [--languages IDS]
                        [--budget 20m | --samples N | --tokens N] [--completion-share S]
                        [--out DIR] [--json]

The commits are replayed as edits and turned into next-edit examples (`training.edit_training`);
the adapter trainer trains on them under the budget and writes `OUT/adapter` (a killed run
resumes in OUT when the same command runs again; `--fresh` starts over). Judge it on newer
commits: `tabloop eval edits --repo DIR --commits NEWER --adapter OUT/adapter --compare`.
Without `--commits`, the `--last` commits below `--before` (default: the newest
`tabloop eval edits` leaves out by default, so the two never overlap) are trained on. With
`--completion-share S` that share of the examples are completions of the repository's files at
the newest commit trained on, and the adapter learns both tasks, as the loop's one adapter does.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from lsp_server import config
from tabloop.model_cli import _Bar, _budget, train_settings_of, trainer_flags
from training.edit_replay import (
    DEFAULT_COMMITS,
    GitHistory,
    ReplayError,
    add_languages_argument,
    files_named,
    language_suffixes,
    languages_replayed,
)

EDIT_RUNS = "edit-adapters"


def _below(repo: Path, before: str | None, languages: tuple[str, ...] | None) -> str:
    """The revision whose ancestors are trained on: `before`, or the parent of the oldest
    commit `tabloop eval edits` judges by default (its newest `DEFAULT_COMMITS` touching the
    files of `languages`)."""
    if before is not None:
        return before
    judged = GitHistory(repo).commits(None, DEFAULT_COMMITS, language_suffixes(languages))
    if not judged:
        raise ReplayError(f"{repo}: no commits touching {files_named(languages)}")
    return f"{judged[0]}^"


def train_edits_main(argv: list[str]) -> int:
    """Entry point of `tabloop train edits`."""
    parser = argparse.ArgumentParser(prog="tabloop train edits", description=__doc__)
    parser.add_argument("--repo", required=True, help="a git repository (a clone with history)")
    parser.add_argument("--commits", help="commit range A..B to train on")
    parser.add_argument(
        "--before",
        help="without --commits: train on commits below this revision (default: below the "
        "commits tabloop eval edits judges by default)",
    )
    parser.add_argument(
        "--last", type=int, default=400, help="without --commits: this many commits (0: all)"
    )
    add_languages_argument(parser)
    parser.add_argument("--out", help="run directory (default: under the cache directory)")
    trainer_flags(parser)
    parser.add_argument("--no-change-share", type=float, default=0.3)
    parser.add_argument(
        "--completion-share",
        type=float,
        default=0.0,
        help="share of completions of the files at the newest commit trained on (both tasks in "
        "one adapter, as the loop trains it; 1: completions only)",
    )
    parser.add_argument("--fresh", action="store_true", help="discard an unfinished run")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when present)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    try:
        budget = _budget(args)
        chosen = train_settings_of(args)
    except ValueError as exc:
        parser.error(str(exc))
    if chosen.objective != "fim":
        parser.error("--objective: next edits train with fim (the examples' own loss)")
    from training.edit_training import train_edits
    from training.workspace import edit_train_settings

    repo = Path(args.repo).resolve()
    settings = config.resolve(repo).settings
    cache_dir = settings.cache_path()
    next_edit = settings.next_edit
    train_settings = edit_train_settings(chosen, next_edit)
    run_dir = Path(args.out) if args.out else cache_dir / EDIT_RUNS / repo.name
    if args.fresh:
        shutil.rmtree(run_dir, ignore_errors=True)
    bar = _Bar(enabled=not args.json)
    try:
        suffixes = language_suffixes(args.languages)
        commits = args.commits or _below(repo, args.before, args.languages)
        result, trained = train_edits(
            repo,
            commits=commits,
            last=0 if args.commits else args.last,
            model=args.model or settings.completion.model,
            cache_dir=cache_dir,
            work_dir=run_dir,
            budget=budget,
            settings=train_settings,
            next_edit=next_edit,
            no_change_share=args.no_change_share,
            completion_share=args.completion_share,
            on_progress=bar,
            device=args.device,
            suffixes=suffixes,
        )
    except (ReplayError, ValueError) as exc:
        raise SystemExit(f"tabloop train edits: {exc}") from None
    finally:
        bar.close()
    record = trained.record()
    newest = record.pop("commits_list")[-1]
    history = GitHistory(repo)
    newer = history.commits(f"{newest}..HEAD", 0, suffixes)
    report: dict[str, Any] = {
        "command": "tabloop train edits " + " ".join(argv),
        "adapter": result.adapter,
        "trained_on": record,
        "languages": languages_replayed(args.languages),
        # What is left to judge it on: the commits after the newest it was trained on.
        "newer_commits": {"range": history.describe_range(newer), "count": len(newer)},
        "training": asdict(result),
    }
    print(json.dumps(report, indent=2))
    return 0


def train_screen_main(argv: list[str]) -> int:
    """Entry point of `tabloop train edit-screen`: the next-edit screen fitted on the replayed
    histories of one or more repositories (`training.edit_screen`), no model run.

        tabloop train edit-screen --repo DIR [--repo DIR ...] [--commits RANGE |
                                  --before REV --last N] [--languages IDS]
                                  [--judge-repo DIR ...] [--below P] [--out FILE] --json

    Each repository's commits default to the `--last` below those `tabloop eval edits` judges;
    the report judges the screen on the commits after them (at most the number `tabloop eval
    edits` judges, never trained on) and on the newest commits of each `--judge-repo` (a
    history it never saw), at `--below`.
    """
    parser = argparse.ArgumentParser(
        prog="tabloop train edit-screen", description=train_screen_main.__doc__
    )
    parser.add_argument("--repo", action="append", required=True, help="a git repository")
    parser.add_argument("--commits", help="commit range A..B to train on (one --repo only)")
    parser.add_argument("--before", help="without --commits: train on commits below this")
    parser.add_argument("--last", type=int, default=400, help="without --commits: this many")
    add_languages_argument(parser)
    parser.add_argument(
        "--judge-repo",
        action="append",
        default=[],
        help="also judge the screen on this repository's newest commits (not trained on)",
    )
    parser.add_argument(
        "--below",
        type=float,
        help="the threshold the report judges at (default: nextEdit.screenBelow)",
    )
    parser.add_argument("--out", help="write the screen here (for nextEdit.screenWeights)")
    parser.add_argument("--json", action="store_true", help="print JSON (the default)")
    args = parser.parse_args(argv)
    if args.commits and len(args.repo) > 1:
        parser.error("--commits names one repository's range")
    from training.edit_screen import fit_screen, judge_screen, screen_rows

    first = Path(args.repo[0]).resolve()
    settings = config.resolve(first).settings
    next_edit = settings.next_edit
    below = next_edit.screen_below if args.below is None else args.below
    count_tokens = _token_counter(settings)
    trained, judged = [], []
    try:
        suffixes = language_suffixes(args.languages)
        for name in args.repo:
            repo = Path(name).resolve()
            history = GitHistory(repo)
            if args.commits:
                commits = history.commits(args.commits, 0, suffixes)
            else:
                older = _below(repo, args.before, args.languages)
                commits = history.commits(older, args.last, suffixes)
            if not commits:
                raise ReplayError(f"{repo}: no commits touching {files_named(args.languages)}")
            trained.append(screen_rows(history, commits, count_tokens, next_edit, suffixes))
            newer = history.commits(f"{commits[-1]}..HEAD", DEFAULT_COMMITS, suffixes)
            if newer:
                judged.append(screen_rows(history, newer, count_tokens, next_edit, suffixes))
        for name in args.judge_repo:
            history = GitHistory(Path(name).resolve())
            newest = history.commits(None, DEFAULT_COMMITS, suffixes)
            judged.append(screen_rows(history, newest, count_tokens, next_edit, suffixes))
        screen = fit_screen(trained)
    except (ReplayError, ValueError) as exc:
        raise SystemExit(f"tabloop train edit-screen: {exc}") from None
    body = screen.to_json()
    if args.out:
        Path(args.out).write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
    report: dict[str, Any] = {
        "command": "tabloop train edit-screen " + " ".join(argv),
        "model": settings.completion.model,
        "next_edit": next_edit.model_dump(),
        "below": below,
        "languages": languages_replayed(args.languages),
        "screen": body,
        "trained": [judge_screen(screen, rows, below) | rows.described for rows in trained],
        "judged": [judge_screen(screen, rows, below) | rows.described for rows in judged],
    }
    print(json.dumps(report, indent=2))
    return 0


def _token_counter(settings: config.Settings) -> Callable[[str], int]:
    """The completion model's tokenizer as the predictor counts a window's tokens."""
    from transformers import AutoTokenizer

    from completion.runners.loading import ensure_plain_copy, resolve_source

    cache_dir = settings.cache_path()
    plain = ensure_plain_copy(resolve_source(settings.completion.model, cache_dir), cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(plain))

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    return count_tokens


def eval_screen_main(argv: list[str]) -> int:
    """Entry point of `tabloop eval edit-screen`: whether a screen refitted on a workspace's own
    history as it grows would beat the bundled one there (`training.edit_screen.replay_refits`);
    no model runs.

        tabloop eval edit-screen --repo DIR [--commits RANGE | --last N] [--languages IDS]
                                 [--below P] [--screen FILE] --json

    The points of the commits (by default the newest 400 touching source files), oldest first,
    stand for the workspace's examples in the order its user made them. Each point is judged by
    the screen in use before it, for each way of refitting (`training.edit_screen.REFITS`),
    against the start screen kept throughout, on the same points.
    """
    parser = argparse.ArgumentParser(
        prog="tabloop eval edit-screen", description=eval_screen_main.__doc__
    )
    parser.add_argument("--repo", required=True, help="a git repository")
    parser.add_argument("--commits", help="commit range A..B to replay")
    parser.add_argument("--last", type=int, default=400, help="without --commits: this many")
    add_languages_argument(parser)
    parser.add_argument(
        "--below", type=float, help="the screen's threshold (default: nextEdit.screenBelow)"
    )
    parser.add_argument("--screen", default="", help="start from this screen, not the bundled")
    parser.add_argument("--json", action="store_true", help="print JSON (the default)")
    args = parser.parse_args(argv)
    from completion.next_edit.screen import ScreenError, load_screen
    from training.edit_screen import REFITS, replay_refits, screen_rows

    repo = Path(args.repo).resolve()
    settings = config.resolve(repo).settings
    next_edit = settings.next_edit
    below = next_edit.screen_below if args.below is None else args.below
    try:
        start = load_screen(args.screen)
        history = GitHistory(repo)
        suffixes = language_suffixes(args.languages)
        commits = history.commits(args.commits, 0 if args.commits else args.last, suffixes)
        if not commits:
            raise ReplayError(f"{repo}: no commits touching {files_named(args.languages)}")
        rows = screen_rows(history, commits, _token_counter(settings), next_edit, suffixes)
    except (ReplayError, ScreenError, ValueError) as exc:
        raise SystemExit(f"tabloop eval edit-screen: {exc}") from None
    trained_on = [str(h.get("repo")) for h in start.trained_on.get("histories", [])]
    report: dict[str, Any] = {
        "command": "tabloop eval edit-screen " + " ".join(argv),
        "model": settings.completion.model,
        "next_edit": next_edit.model_dump(),
        "below": below,
        "languages": languages_replayed(args.languages),
        "start_screen": args.screen or "bundled",
        "start_screen_trained_on": trained_on,
        "history": rows.described,
        "runs": [replay_refits(rows, start, below, kind) for kind in REFITS],
    }
    if any(Path(name).name == repo.name for name in trained_on):
        report["warning"] = "the start screen was fitted on a repository of this name"
    print(json.dumps(report, indent=2))
    return 0
