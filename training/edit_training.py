"""Training a next-edit adapter on a repository's history, with the adapter trainer as it is.

The commits are replayed (`training.edit_replay`) with the windows the predictor would rewrite
(its token budget counted by the model's tokenizer), the points become examples
(`training.edit_examples`), and `training.trainer.Trainer` trains a LoRA on them with the
verbatim template, its budget, checkpoints and resume unchanged. The adapter directory then
says what it was trained on (`edit_training.json`: the repository, the commit range and every
commit in it, the counts), so `tabloop eval edits --adapter` reports it and warns when the
commits judged overlap it (train on older commits, judge on newer ones).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from completion.next_edit import NextEditSettings
from training.budget import Budget
from training.edit_examples import (
    EDIT_TEMPLATE,
    NO_CHANGE_SHARE,
    replay_examples,
    stream_edit_examples,
    token_windows,
    write_edit_training,
)
from training.edit_replay import GitHistory, ReplaySettings, replay_commits
from training.trainer import Progress, Trainer, TrainResult, TrainSettings
from training.workspace import load_trainable


@dataclass(frozen=True)
class EditTraining:
    """What a run trained on (written beside the adapter, and reported)."""

    repo: str
    range: str
    commits: list[str]
    replay: dict[str, Any]
    examples: dict[str, int]
    no_change_share: float

    def record(self) -> dict[str, Any]:
        found = asdict(self)
        found["commits_list"] = found.pop("commits")
        found["commit_count"] = len(self.commits)
        return found


def train_edits(
    repo: Path,
    *,
    commits: str | None,
    last: int,
    model: str,
    cache_dir: Path,
    work_dir: Path,
    budget: Budget,
    settings: TrainSettings,
    next_edit: NextEditSettings | None = None,
    no_change_share: float = NO_CHANGE_SHARE,
    on_progress: Callable[[Progress], None] | None = None,
    device: str | None = None,
) -> tuple[TrainResult, EditTraining]:
    """Train in `work_dir` (resuming there) on the commits `commits` of `repo` (a range `A..B`,
    or the newest `last` non-merge commits touching Python files below the revision it names)."""
    next_edit = next_edit or NextEditSettings()
    history = GitHistory(repo)
    chosen = history.commits(commits, last, (".py",))
    if not chosen:
        raise ValueError(f"{repo}: no commits touching Python files in {commits or 'HEAD'}")
    trainable = load_trainable(model, cache_dir, settings)
    tokenizer = trainable.tokenizer

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    points, counts = replay_commits(
        history,
        chosen,
        ReplaySettings(window_lines=next_edit.window_lines),
        token_windows(count_tokens, next_edit),
    )
    # The trainer keeps the last three quarters of its prompt budget for the text before the
    # middle; a longer prompt would lose its first edits, so it is not an example.
    examples, made = replay_examples(
        points,
        count_tokens,
        next_edit,
        max_prompt_tokens=settings.max_prompt_tokens * 3 // 4,
        no_change_share=no_change_share,
        seed=settings.seed,
    )
    if not examples:
        raise ValueError(f"{repo}: no training examples in {history.describe_range(chosen)}")
    trainer = Trainer(
        trainable.model,
        tokenizer,
        EDIT_TEMPLATE,
        trainable.base_model_id,
        settings,
        work_dir,
        device=device,
    )
    result = trainer.run(lambda: stream_edit_examples(examples, settings.seed), budget, on_progress)
    trained = EditTraining(
        str(repo.resolve()),
        history.describe_range(chosen),
        chosen,
        counts.summary(),
        made.summary(),
        no_change_share,
    )
    write_edit_training(Path(result.adapter), trained.record())
    return result, trained
