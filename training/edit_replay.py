"""A repository's commit history replayed as a user's edits, and the next-edit points it makes.

Each commit (against its first parent) is a set of file changes; each file change is a sequence
of hunks (maximal runs of changed lines, `difflib` on lines as LSP splits them) made top to
bottom, as a user working down a file would. After the first `k` hunks of a file's change the
user has made `k` edits there: that is a *prediction point*. Its edit history is those `k` hunks
(after the hunks of the files changed before it in the same commit), the cursor sits at the end
of the `k`-th hunk, and the *target* is the text after the next hunk when that hunk lies inside
the window around the cursor, else the text as it is ("no change" is the right answer: these
points judge no-op accuracy).

What cannot be a fair point is skipped and counted by reason: files added or deleted, not UTF-8,
too large, generated, or rewritten wholesale (most lines changed, or many hunks); points whose
next hunk, or recent history (what a prompt shows), holds a hunk over `max_hunk_lines` lines; a
next hunk that straddles the window's edge. The points are a pure function of the repository,
the commits and the settings, and `sample_points` draws from them with a seed, so a run can be
repeated exactly.

Evaluation (`evaluation.edits`) judges predictions on these points; `training.edit_examples`
turns points of older commits into training examples.
"""

from __future__ import annotations

import argparse
import difflib
import random
import re
import subprocess
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Literal

from common.languages import SOURCE_LANGUAGES, extensions_for
from completion.next_edit.text import lines_of

WINDOW_LINES = 10
"""Lines above and below the cursor's line that a prediction point judges (Sweep's ±10)."""
MAX_HUNK_LINES = 12
MAX_HUNKS = 30
REWRITE_SHARE = 0.5
MAX_FILE_BYTES = 300_000
MAX_HISTORY = 8
PROMPT_EDITS = 3
"""Recent edits a next-edit prompt shows (Sweep's 3): a huge hunk among them spoils a point."""
DEFAULT_COMMITS = 100
ALL_SUBSETS_UP_TO = 6  # upcoming hunks (`EditPoint.is_upcoming`): 63 combinations at most
GENERATED_NAMES = re.compile(
    r"(_pb2(_grpc)?\.pyi?|\.pb\.(py|go|cc|h)|_version\.py|\.min\.(js|css))$"
)
GENERATED_MARK = re.compile(r"generated|do not edit", re.IGNORECASE)

SOURCE_SUFFIXES = extensions_for(SOURCE_LANGUAGES)
"""The extensions of every source language `common.languages` knows (not prose, markup or
settings)."""

PointKind = Literal["edit", "no_change_after_last", "no_change_outside_window"]

WindowRule = Callable[[Sequence[str], int], "tuple[int, int] | None"]
"""The lines [start, end) a prediction may rewrite, given the file's lines and the cursor's line
(None: no window fits); the predictor's own rule, so that targets are judged on its windows."""


class ReplayError(ValueError):
    """The repository or the commit range cannot be replayed (with the reason)."""


def language_suffixes(languages: Sequence[str] | None) -> tuple[str, ...]:
    """The file suffixes a replay of `languages` (LSP ids, such as `python` or `go`) reads;
    every source language's when None or empty. Raises `ReplayError` for an id not known."""
    if not languages:
        return SOURCE_SUFFIXES
    try:
        return extensions_for(languages)
    except ValueError as exc:
        raise ReplayError(str(exc)) from exc


def add_languages_argument(parser: argparse.ArgumentParser) -> None:
    """`--languages python,go`: the languages a command replays (default: every source one)."""
    parser.add_argument(
        "--languages",
        type=lambda text: tuple(name.strip() for name in text.split(",") if name.strip()),
        metavar="IDS",
        help="replay only these languages' files: LSP ids, comma-separated "
        "(default: every source language)",
    )


def files_named(languages: Sequence[str] | None) -> str:
    """The files a replay of `languages` reads, in words (for messages)."""
    return f"{', '.join(languages)} files" if languages else "source files"


def languages_replayed(languages: Sequence[str] | None) -> list[str]:
    """The LSP ids a replay of `languages` reads, as a report names them (every source
    language's when None or empty)."""
    return list(languages or SOURCE_LANGUAGES)


@dataclass(frozen=True)
class ReplaySettings:
    """What decides which points a history makes."""

    window_lines: int = WINDOW_LINES
    max_hunk_lines: int = MAX_HUNK_LINES
    max_hunks: int = MAX_HUNKS
    rewrite_share: float = REWRITE_SHARE
    max_file_bytes: int = MAX_FILE_BYTES
    max_history: int = MAX_HISTORY
    prompt_edits: int = PROMPT_EDITS
    suffixes: tuple[str, ...] = SOURCE_SUFFIXES
    """The files replayed: those whose name ends so (default: every source language's)."""


@dataclass(frozen=True)
class Hunk:
    """Lines `[old_start, old_end)` of the file before the change replaced by `new`, which are
    lines `[new_start, new_end)` of the file after it."""

    old_start: int
    old_end: int
    new_start: int
    new_end: int
    old: tuple[str, ...]
    new: tuple[str, ...]

    @property
    def size(self) -> int:
        """Lines the hunk removes or adds, whichever is more."""
        return max(len(self.old), len(self.new))


def line_hunks(before: Sequence[str], after: Sequence[str]) -> list[Hunk]:
    """The hunks turning lines `before` into lines `after`, top to bottom."""
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    return [
        Hunk(i1, i2, j1, j2, tuple(before[i1:i2]), tuple(after[j1:j2]))
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    ]


@dataclass(frozen=True)
class FileChange:
    """One file's change in one commit, replayed hunk by hunk."""

    commit: str
    path: str
    before: str
    after: str

    @cached_property
    def before_lines(self) -> list[str]:
        return lines_of(self.before)

    @cached_property
    def after_lines(self) -> list[str]:
        return lines_of(self.after)

    @cached_property
    def hunks(self) -> list[Hunk]:
        return line_hunks(self.before_lines, self.after_lines)

    def text_after(self, k: int) -> str:
        """The file once the first `k` hunks are made (0: as before the commit)."""
        if k == 0:
            return self.before
        last = self.hunks[k - 1]
        return "".join(self.after_lines[: last.new_end] + self.before_lines[last.old_end :])

    def shift_after(self, k: int) -> int:
        """How many lines the first `k` hunks added (negative: removed) above the rest."""
        return 0 if k == 0 else self.hunks[k - 1].new_end - self.hunks[k - 1].old_end


@dataclass(frozen=True)
class ReplayedEdit:
    """The `index`-th hunk (0-based) of a file change, as one edit the user made."""

    change: FileChange
    index: int

    @property
    def path(self) -> str:
        return self.change.path

    @property
    def hunk(self) -> Hunk:
        return self.change.hunks[self.index]

    @property
    def before(self) -> str:
        """The whole file before this edit."""
        return self.change.text_after(self.index)

    @property
    def after(self) -> str:
        """The whole file after this edit."""
        return self.change.text_after(self.index + 1)

    @property
    def start_line(self) -> int:
        """The first line the edit touched (the same in the text before and after it)."""
        return self.hunk.new_start

    @property
    def removed(self) -> str:
        return "".join(self.hunk.old)

    @property
    def inserted(self) -> str:
        return "".join(self.hunk.new)


@dataclass(frozen=True)
class EditPoint:
    """A place to ask for the next edit: the file after `done` hunks of `change`, the history
    that led there, the cursor at the last edit, the lines judged, and the text expected next."""

    change: FileChange
    done: int
    history: tuple[ReplayedEdit, ...]  # oldest first; the last is the edit at the cursor
    kind: PointKind
    window: tuple[int, int]  # lines [start, end) of `text` around the cursor

    @property
    def commit(self) -> str:
        return self.change.commit

    @property
    def path(self) -> str:
        return self.change.path

    @property
    def text(self) -> str:
        """The file as the user has it now."""
        return self.change.text_after(self.done)

    @property
    def expects_change(self) -> bool:
        return self.kind == "edit"

    @property
    def target(self) -> str:
        """The file as it should be after the next edit (the text now when none is due)."""
        return self.change.text_after(self.done + 1) if self.expects_change else self.text

    @property
    def cursor(self) -> tuple[int, int]:
        """(line, character), 0-based, at the end of the last edit's new lines (at the start of
        the line where lines were removed, for a pure deletion)."""
        return cursor_after(self.change, self.done)

    @property
    def key(self) -> str:
        """A stable name of the point (commit, path, hunks done)."""
        return f"{self.commit[:12]}:{self.path}:{self.done}"

    def upcoming_hunks(self) -> list[Hunk]:
        """The file's hunks still to come in this commit that lie inside the window, in the
        coordinates of the text now (their `old_*` lines are lines of `text`; `new_*` stay
        those of the file after the commit): the edits the user goes on to make here, the next
        one first when it is inside."""
        shift = self.change.shift_after(self.done)
        start, end = self.window
        found = []
        for hunk in self.change.hunks[self.done :]:
            first, last = hunk.old_start + shift, hunk.old_end + shift
            if start <= first < end and last <= end:  # as `file_points` counts "inside"
                found.append(replace(hunk, old_start=first, old_end=last))
        return found

    def is_upcoming(self, predicted: str) -> bool:
        """Whether `predicted` (the whole file) is the text now with some of the upcoming hunks
        made and nothing else: an edit the user makes later in this commit, shown early, or
        several at once. With up to `ALL_SUBSETS_UP_TO` upcoming hunks every combination is
        tried; with more, the first k for every k, and each alone."""
        if predicted == self.text:
            return False
        hunks = self.upcoming_hunks()
        if len(hunks) <= ALL_SUBSETS_UP_TO:
            subsets: Iterable[Sequence[Hunk]] = (
                [hunk for bit, hunk in enumerate(hunks) if mask >> bit & 1]
                for mask in range(1, 1 << len(hunks))
            )
        else:
            subsets = [*(hunks[:k] for k in range(1, len(hunks) + 1)), *([h] for h in hunks)]
        lines = lines_of(self.text)
        return any(_made(lines, subset) == predicted for subset in subsets)


def _made(lines: Sequence[str], hunks: Sequence[Hunk]) -> str:
    """`lines` with `hunks` (sorted, in their coordinates) made."""
    out: list[str] = []
    at = 0
    for hunk in hunks:
        out += lines[at : hunk.old_start]
        out += hunk.new
        at = hunk.old_end
    return "".join(out + list(lines[at:]))


def cursor_after(change: FileChange, k: int) -> tuple[int, int]:
    """Where the cursor is after the `k`-th hunk (1-based) of `change` is made."""
    hunk = change.hunks[k - 1]
    lines = lines_of(change.text_after(k))
    if hunk.new_end > hunk.new_start:
        line = hunk.new_end - 1
        return line, len(lines[line].rstrip("\r\n"))
    return min(hunk.new_start, max(len(lines) - 1, 0)), 0


def window_around(line: int, line_count: int, window_lines: int) -> tuple[int, int]:
    """Lines [start, end) within `window_lines` of `line`, clipped to the file."""
    return max(0, line - window_lines), min(line_count, line + window_lines + 1)


@dataclass
class ReplayCounts:
    """What a replay found and what it skipped, by reason."""

    commits: int = 0
    files: Counter[str] = field(default_factory=Counter)  # "replayed" or a reason skipped
    points: Counter[str] = field(default_factory=Counter)  # a kind or a reason skipped

    def summary(self) -> dict[str, object]:
        return {
            "commits": self.commits,
            "files": dict(sorted(self.files.items())),
            "points": dict(sorted(self.points.items())),
        }


def skip_reason(change: FileChange, settings: ReplaySettings) -> str | None:
    """Why a file change makes no points (None: it makes some)."""
    if GENERATED_NAMES.search(change.path) or any(
        GENERATED_MARK.search(line) for line in change.before_lines[:5]
    ):
        return "generated"
    hunks = change.hunks
    if not hunks:
        return "no_line_change"
    if len(hunks) > settings.max_hunks:
        return "rewrite"
    changed = sum(h.size for h in hunks)
    if changed > settings.rewrite_share * max(len(change.before_lines), len(change.after_lines)):
        return "rewrite"
    return None


def lines_window(window_lines: int) -> WindowRule:
    """The rule of `window_lines` lines above and below the cursor's line."""

    def rule(lines: Sequence[str], line: int) -> tuple[int, int]:
        return window_around(line, len(lines), window_lines)

    return rule


def file_points(
    change: FileChange,
    earlier: Sequence[ReplayedEdit],
    settings: ReplaySettings,
    counts: ReplayCounts,
    window_rule: WindowRule | None = None,
) -> list[EditPoint]:
    """The points of one file change, after the edits `earlier` of the same commit, judged on
    the windows of `window_rule` (default: `settings.window_lines` lines around the cursor)."""
    rule = window_rule or lines_window(settings.window_lines)
    points = []
    hunks = change.hunks
    for done in range(1, len(hunks) + 1):
        made = [ReplayedEdit(change, i) for i in range(done)]
        history = (*earlier, *made)[-settings.max_history :]
        recent = history[-settings.prompt_edits :]
        if any(edit.hunk.size > settings.max_hunk_lines for edit in recent):
            counts.points["skipped_huge_hunk_in_history"] += 1
            continue
        line, _ = cursor_after(change, done)
        window = rule(lines_of(change.text_after(done)), line)
        if window is None:
            counts.points["skipped_no_window"] += 1
            continue
        kind: PointKind = "no_change_after_last"
        if done < len(hunks):
            following = hunks[done]
            start = following.old_start + change.shift_after(done)
            end = following.old_end + change.shift_after(done)
            if start >= window[1] or (end <= window[0] and (start, end) != (window[0],) * 2):
                kind = "no_change_outside_window"
            elif start < window[0] or end > window[1]:
                counts.points["skipped_straddles_window"] += 1
                continue
            elif following.size > settings.max_hunk_lines:
                counts.points["skipped_huge_next_hunk"] += 1
                continue
            else:
                kind = "edit"
        counts.points[kind] += 1
        points.append(EditPoint(change, done, history, kind, window))
    return points


class GitHistory:
    """Reads commits and file versions of a git repository with the `git` command."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo.resolve()
        if not (self.repo / ".git").exists() and not (self.repo / "HEAD").is_file():
            raise ReplayError(f"{repo} is not a git repository")

    def git(self, *args: str) -> str:
        try:
            done = subprocess.run(
                ["git", "-C", str(self.repo), *args],
                capture_output=True,
                check=True,
                text=True,
                encoding="utf-8",
                errors="surrogateescape",
            )
        except subprocess.CalledProcessError as exc:
            raise ReplayError(f"git {' '.join(args)}: {exc.stderr.strip()}") from None
        return done.stdout

    def show(self, commit: str, path: str) -> bytes:
        done = subprocess.run(
            ["git", "-C", str(self.repo), "show", f"{commit}:{path}"],
            capture_output=True,
            check=True,
        )
        return done.stdout

    def commits(
        self, commits: str | None, count: int, suffixes: Sequence[str] = SOURCE_SUFFIXES
    ) -> list[str]:
        """Non-merge commits touching files with `suffixes` (default: source files of every
        language `common.languages` knows), oldest first: those of the range
        `commits` (`A..B`, or one revision and its ancestors), the newest `count` of them (0:
        all)."""
        limit = ["--max-count", str(count)] if count else []
        listed = self.git(
            "rev-list",
            "--no-merges",
            *limit,
            commits or "HEAD",
            "--",
            *(f":(icase)*{suffix}" for suffix in suffixes),
        ).split()
        return listed[::-1]

    def describe_range(self, commits: Sequence[str]) -> str:
        """`A^..B` for `commits` (oldest first): A is the oldest, B the newest. Every commit of
        the list is in the range and none older than A; in a history with merges the range may
        also hold side-branch commits that a `--last` count left out (never an ancestor of A)."""
        if not commits:
            return ""
        return f"{commits[0][:12]}^..{commits[-1][:12]}"

    def changes(
        self, commit: str, settings: ReplaySettings, counts: ReplayCounts
    ) -> Iterator[FileChange]:
        """The commit's modified files (against its first parent) that make points, by path."""
        parents = self.git("rev-list", "--parents", "-n", "1", commit).split()[1:]
        if not parents:
            counts.files["root_commit"] += 1
            return
        listing = self.git(
            "diff-tree", "-r", "--no-renames", "--name-status", parents[0], commit
        ).splitlines()
        for row in listing:
            status, _, path = row.partition("\t")
            if not path.lower().endswith(settings.suffixes):
                continue
            if status != "M":
                counts.files[{"A": "added", "D": "deleted"}.get(status, f"status_{status}")] += 1
                continue
            old, new = self.show(parents[0], path), self.show(commit, path)
            if max(len(old), len(new)) > settings.max_file_bytes:
                counts.files["too_large"] += 1
                continue
            try:
                change = FileChange(commit, path, old.decode("utf-8"), new.decode("utf-8"))
            except UnicodeDecodeError:
                counts.files["not_utf8"] += 1
                continue
            reason = skip_reason(change, settings)
            if reason is not None:
                counts.files[reason] += 1
                continue
            counts.files["replayed"] += 1
            yield change


def replay_commits(
    history: GitHistory,
    commits: Sequence[str],
    settings: ReplaySettings,
    window_rule: WindowRule | None = None,
) -> tuple[list[EditPoint], ReplayCounts]:
    """Every point of `commits` (oldest first), in order, and the counts of what was skipped
    (windows by `window_rule`, as `file_points`)."""
    counts = ReplayCounts(commits=len(commits))
    points: list[EditPoint] = []
    for commit in commits:
        earlier: list[ReplayedEdit] = []
        for change in history.changes(commit, settings, counts):
            points.extend(file_points(change, earlier, settings, counts, window_rule))
            earlier.extend(ReplayedEdit(change, i) for i in range(len(change.hunks)))
    return points, counts


def sample_points(points: Sequence[EditPoint], n: int, seed: int) -> list[EditPoint]:
    """`n` of `points` drawn with `seed` (all when there are fewer), in their replay order."""
    if n >= len(points):
        return list(points)
    chosen = sorted(random.Random(seed).sample(range(len(points)), n))
    return [points[i] for i in chosen]
