"""A workspace's next-edit adapter: a track of its own beside the completion adapters.

One adapter for both tasks was measured against one for each (docs/next-edit.md, "One adapter
for both tasks, or one for each"): on click's history the adapter that learned only next edits
wrote more right edits (0.58 against 0.52 exact) and far fewer needless ones (no-op accuracy
0.975 against 0.873); on requests' the two were even. So where next edits have a runner of their
own (`nextEdit.engine` resolves to `torch-bfloat16`, which serves any adapter without a second
converted model) the loop trains them as a second track: `tabloop train model --task next-edit`
keeps its versions in a registry of their own (`EDIT_TRACK` under the workspace's adapter
directory) with the same promotion, history and rollback, and the completion runs train on code
and feedback alone (`--task completion`).

A next-edit run trains on:
- the workspace's git history, where there is one: the newest `HISTORY_COMMITS` commits touching
  source files (of every language `common.languages` knows) replayed as edits
  (`training.edit_replay`, as `tabloop train edits` does), less the newest `JUDGED_COMMITS`,
  whose points judge the version (all of them, as the history has them: mostly "no change",
  where a model that writes needless edits loses what it gains elsewhere);
- the examples the server kept from the user's own editing (`training.edit_store`), less the
  newest, held out for judging (`training.workspace.live_edit_examples`), `LIVE_SHARE` of what
  it reads while there are any.

The head commit and the newest kept example are fixed in the run's plan when it first starts, so
a resumed run reads the same.

A version warm-started from another goes on reading the history where that one stopped: each
version records which examples its chain has read in the current lap (`HistoryRead`, in its
`edit_training.json`), and the next reads the rest of the lap, in the same seeded order, before
it starts the next lap in an order of its own. A chain of versions thus reads what one long run
would, but that the rest of the lap starts with the examples of commits its predecessor did not
train on (new commits since it ran: the user's latest work). Before, every version read the same
seeded order from its start, so a 20-minute version warm-started from another read again the
examples its predecessor had just learned (about a third of a 200-commit history) and never the
rest. A run goes on past the last run from the same weights too when that one was not promoted
(`history_read_before`), rather than read its examples again.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from completion.next_edit import NextEditSettings
from training.budget import Budget
from training.edit_examples import (
    EDIT_TEMPLATE,
    NO_CHANGE_SHARE,
    EditExample,
    HistoryRead,
    history_laps,
    live_laps,
    read_after,
    read_edit_training,
    replay_examples,
    token_windows,
    write_edit_training,
)
from training.edit_replay import GitHistory, ReplayError, ReplaySettings, replay_commits
from training.edit_store import EditExampleStore
from training.examples import FimExample
from training.registry import AdapterRegistry, AdapterRegistryError, scope_dir
from training.trainer import Progress, TrainResult, TrainSettings, mixed_stream
from training.workspace import (
    PLAN_FILE,
    RunPlan,
    WarmStart,
    edit_train_settings,
    live_edit_examples,
    load_trainable,
)

EDIT_TRACK = "next-edit"
"""The next-edit registry's directory under a workspace's adapter directory."""
HISTORY_COMMITS = 200
"""The newest commits touching source files a next-edit run replays from the workspace's history
(about 20 minutes of training reads a few hundred of their examples on a 2-core CPU)."""
JUDGED_COMMITS = 10
"""Of those, the newest: never trained on, their points judge the version."""
LIVE_SHARE = 0.5
"""Of what a run reads, the share of the user's own examples while there are any beside history."""

TASKS = ("both", "completion", "next-edit")
"""`tabloop train model --task`: one adapter for completions and next edits (`both`, where next
edits are served by the completion engine), completions alone, or the next-edit track."""


def edit_registry(cache_dir: Path, workspace: Path) -> AdapterRegistry:
    """The registry of the workspace's next-edit adapters."""
    return AdapterRegistry(scope_dir(cache_dir, workspace=workspace) / EDIT_TRACK, f"{EDIT_TRACK}-")


def history_of(root: Path) -> GitHistory | None:
    """The workspace's git history (None: not a repository, or git cannot read it)."""
    try:
        history = GitHistory(root)
        history.git("rev-parse", "--verify", "HEAD")
    except (ReplayError, OSError):
        return None
    return history


def history_head(root: Path) -> str | None:
    """The commit the workspace's HEAD names (None: no history)."""
    history = history_of(root)
    return history.git("rev-parse", "HEAD").strip() if history is not None else None


def split_commits(
    history: GitHistory, head: str, count: int = HISTORY_COMMITS, judged: int = JUDGED_COMMITS
) -> tuple[list[str], list[str]]:
    """The newest `count` commits touching source files below `head` (oldest first), split into
    those trained on and the newest `judged` (fewer when the history is short: at least half
    of it is trained on)."""
    commits = history.commits(head, count)
    held = min(judged, len(commits) // 2)
    return commits[: len(commits) - held], commits[len(commits) - held :]


class HistoryExamples:
    """The examples a workspace's history makes, for training and for judging, with their
    counts; every list empty without a history."""

    def __init__(
        self,
        root: Path,
        head: str | None,
        count_tokens: Callable[[str], int],
        max_prompt_tokens: int,
        seed: int,
        next_edit: NextEditSettings,
    ) -> None:
        self.train: list[EditExample] = []
        self.judged: list[EditExample] = []
        self.trained_commits: list[str] = []
        self.summary: dict[str, Any] = {
            "head": head,
            "max_prompt_tokens": max_prompt_tokens,
            "seed": seed,
        }
        history = history_of(root) if head is not None else None
        if history is None or head is None:
            return
        trained, judged = split_commits(history, head)
        self.trained_commits = trained
        replay = ReplaySettings(window_lines=next_edit.window_lines)
        windows = token_windows(count_tokens, next_edit)
        # Training caps the no-change examples (`NO_CHANGE_SHARE`); judging takes the points
        # as the history has them, mostly "no change", as a served model meets them.
        for name, commits, share in (
            ("train", trained, NO_CHANGE_SHARE),
            ("judged", judged, None),
        ):
            if not commits:
                continue
            points, counts = replay_commits(history, commits, replay, windows)
            examples, made = replay_examples(
                points,
                count_tokens,
                next_edit,
                max_prompt_tokens=max_prompt_tokens,
                no_change_share=share,
                seed=seed,
            )
            setattr(self, name, examples)
            self.summary[name] = {
                "range": history.describe_range(commits),
                "commits": len(commits),
                "replay": counts.summary(),
                "examples": made.summary(),
            }


def judged_examples(
    train: dict[str, Any],
    root: Path,
    limit: int,
    count_tokens: Callable[[str], int],
    next_edit: NextEditSettings | None = None,
) -> list[EditExample]:
    """Up to `limit` examples of the commits a next-edit version held out (its training record
    `train` names them), spread evenly over them, made again with the model's tokenizer
    (`count_tokens`) and the `nextEdit` windows as the run made them; none when it held none out
    or the history no longer has them."""
    history = (train.get("edit_examples") or {}).get("history") or {}
    if limit <= 0 or not history.get("judged"):
        return []
    try:
        found = HistoryExamples(
            root,
            history["head"],
            count_tokens,
            int(history["max_prompt_tokens"]),
            int(history["seed"]),
            next_edit or NextEditSettings(),
        )
    except ReplayError:
        return []  # the commits are gone (a rewritten history)
    examples = found.judged
    if len(examples) <= limit:
        return examples
    step = len(examples) / limit
    return [examples[int(i * step)] for i in range(limit)]


def train_workspace_edits(
    root: Path,
    *,
    model: str,
    cache_dir: Path,
    work_dir: Path,
    budget: Budget,
    settings: TrainSettings,
    edits: EditExampleStore | None,
    registry: AdapterRegistry,
    next_edit: NextEditSettings | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    device: str | None = None,
) -> TrainResult:
    """Train the workspace's next-edit adapter in `work_dir` (resuming there) on its history and
    the user's own examples, starting from the next-edit version serving in `registry` when it
    fits. The result's `edit_examples` says what it read and held out (`history`: the commits
    trained on and judged)."""
    plan = RunPlan.load(work_dir)
    if plan is None:
        plan = RunPlan.new(
            registry, 0, edits.last_id() if edits is not None else 0, head=history_head(root)
        )
        plan.save(work_dir)
    next_edit = next_edit or NextEditSettings()
    settings = edit_train_settings(settings, next_edit)
    trainable = load_trainable(model, cache_dir, settings, plan.warm_source(registry))
    tokenizer = trainable.tokenizer

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    live, counts = live_edit_examples(edits, plan.edits_upto, count_tokens, settings)
    history = HistoryExamples(
        root, plan.head, count_tokens, settings.edit_prompt_tokens, settings.seed, next_edit
    )
    if not live and not history.train:
        (work_dir / PLAN_FILE).unlink(missing_ok=True)  # nothing started: no run to resume
        raise ValueError(
            f"{root}: no next-edit examples to train on (no git history with changes to "
            "source files, and none kept from editing yet)"
        )
    before, known = history_read_before(registry, trainable.warm_start.version)
    tagged = _tagged_stream(history.train, live, settings.seed, before, known)
    trainer = trainable.trainer(settings, work_dir, device, EDIT_TEMPLATE)
    result = trainer.run(_untagged(tagged), budget, on_progress)
    result.warm_start = trainable.warm_start.summary()
    read = sum(tag == "history" for tag, _ in itertools.islice(tagged(), result.position))
    after = read_after(history.train, settings.seed, before, read, known)
    if history.train:
        history.summary["read"] = {
            "lap": before.lap,
            "unread_at_start": before.unread(history.train),
            "new_commits": len(set(history.trained_commits) - set(known)) if known else None,
            "read": read,
            "lap_after": after.lap,
            "unread_after": after.unread(history.train),
        }
    result.edit_examples = {**counts, "history": history.summary}
    if history.trained_commits:
        # As `tabloop train edits` says it: `tabloop eval edits --adapter` reports the commits
        # and warns when those it judges overlap them.
        trained = history.summary["train"]
        record = {
            "repo": str(root.resolve()),
            "range": trained["range"],
            "commits_list": history.trained_commits,
            "commit_count": len(history.trained_commits),
            "examples": trained["examples"],
            "live_examples": counts.get("edit", 0) + counts.get("no_change", 0),
            "history_read": after.record(),
        }
        write_edit_training(Path(result.adapter), record)
    return result


def history_read_before(
    registry: AdapterRegistry, version: int | None
) -> tuple[HistoryRead, frozenset[str]]:
    """Where the last run from `version`'s weights (None: fresh) left the history's examples,
    and the commits it trained on: the record of the newest version warm-started from it, if
    any (a run turned down by its judgement, most often), else `version`'s own; nothing read and
    no commits for a fresh chain or a version that kept no record of them.

    A run that starts from the same weights as one before it reads on past what that one read,
    promoted or not: reading the same examples again in the same order from the same weights
    would make much the same version, which the same judgement would turn down again (without
    new commits, the same examples in the same order). Those examples come round again in the
    chain's next lap."""
    record = _newest_run_from(registry, version)
    if record is None and version is not None:
        record = _edit_record(registry, version)
    if record is None:
        return HistoryRead(), frozenset()
    commits = record.get("commits_list")
    known = (
        frozenset(c for c in commits if isinstance(c, str))
        if isinstance(commits, list)
        else frozenset()
    )
    return HistoryRead.from_record(record.get("history_read")), known


def _edit_record(registry: AdapterRegistry, version: int) -> dict[str, Any] | None:
    try:
        return read_edit_training(registry.path(version))
    except AdapterRegistryError:
        return None


def _newest_run_from(registry: AdapterRegistry, version: int | None) -> dict[str, Any] | None:
    """The training record of the newest version that warm-started from `version` (None: a
    fresh one), as the registry's entry for each says (the run's `warm_start`); an entry that
    does not say is not counted."""
    started = WarmStart(version, "").summary()["from"]  # as the runs' reports name it
    for entry in sorted(registry.versions(), key=lambda v: v.version, reverse=True):
        if version is not None and entry.version <= version:
            break
        warm = entry.train.get("warm_start")
        if isinstance(warm, dict) and "from" in warm and warm["from"] == started:
            return _edit_record(registry, entry.version)
    return None


Tagged = tuple[str, EditExample]


def _tagged_stream(
    history: Sequence[EditExample],
    live: Sequence[EditExample],
    seed: int,
    read: HistoryRead,
    known: frozenset[str],
) -> Callable[[], Iterator[Tagged]]:
    """The run's examples, each with where it came from ("history" or "live"): a pure function
    of its arguments, so the first `position` items are what the trainer read."""

    def make() -> Iterator[Tagged]:
        laps = history_laps(history, seed, read, known)
        replayed = (("history", example) for _, example in laps)
        kept = (("live", example) for example in live_laps(live, seed))
        if not live:
            return replayed
        if not history:
            return kept
        return mixed_stream(replayed, kept, LIVE_SHARE)

    return make


def _untagged(tagged: Callable[[], Iterator[Tagged]]) -> Callable[[], Iterator[FimExample]]:
    def make() -> Iterator[FimExample]:
        return (example.fim() for _, example in tagged())

    return make
