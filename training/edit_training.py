"""Training a next-edit adapter on a repository's history, with the adapter trainer as it is.

The commits are replayed (`training.edit_replay`) with the windows the predictor would rewrite
(its token budget counted by the model's tokenizer), the points become examples
(`training.edit_examples`), and `training.trainer.Trainer` trains a LoRA on them with the
verbatim template, its budget, checkpoints and resume unchanged. The adapter directory then
says what it was trained on (`edit_training.json`: the repository, the commit range and every
commit in it, the counts), so `tabloop eval edits --adapter` reports it and warns when the
commits judged overlap it (train on older commits, judge on newer ones).

With a `completion_share` the adapter learns both tasks, as the loop's adapter does: that share
of its examples are completions of the repository's files as they were at the newest commit
trained on (a `git archive` of it in the run directory; its held-out files, the hash split of
`tabloop train model`, are left for judging), the rest next edits. At 1 it is a completion
adapter of the same files, for comparison.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from completion.fim import template_for
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
from training.edit_replay import (
    SOURCE_SUFFIXES,
    GitHistory,
    ReplayError,
    ReplaySettings,
    replay_commits,
)
from training.examples import FimExample, split_files, stream_code_examples, workspace_files
from training.trainer import Progress, Trainer, TrainResult, TrainSettings, mixed_stream
from training.workspace import load_trainable

SNAPSHOT = "snapshot"
"""Under the run directory: the repository's files at the newest commit trained on."""
SHARES = "shares.json"
"""Under the run directory: the shares of examples the run started with."""


@dataclass(frozen=True)
class EditTraining:
    """What a run trained on (written beside the adapter, and reported)."""

    repo: str
    range: str
    commits: list[str]
    replay: dict[str, Any]
    examples: dict[str, int]
    no_change_share: float
    completion_share: float = 0.0
    completions: dict[str, Any] | None = None

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
    completion_share: float = 0.0,
    on_progress: Callable[[Progress], None] | None = None,
    device: str | None = None,
    suffixes: tuple[str, ...] = SOURCE_SUFFIXES,
) -> tuple[TrainResult, EditTraining]:
    """Train in `work_dir` (resuming there) on the commits `commits` of `repo` (a range `A..B`,
    or the newest `last` non-merge commits touching files with `suffixes`, by default every
    source language's, below the revision it names), `completion_share` of the examples
    completions of the files at the newest of them."""
    if not 0.0 <= completion_share <= 1.0:
        raise ValueError(f"completion_share must be in [0, 1], not {completion_share}")
    same_shares(
        work_dir, {"no_change_share": no_change_share, "completion_share": completion_share}
    )
    next_edit = next_edit or NextEditSettings()
    history = GitHistory(repo)
    chosen = history.commits(commits, last, suffixes)
    if not chosen:
        raise ValueError(f"{repo}: no commits touching the files replayed in {commits or 'HEAD'}")
    completions: dict[str, Any] | None = None
    code_files: list[str] = []
    if completion_share > 0:
        snapshot = work_dir / SNAPSHOT
        export_snapshot(history, chosen[-1], snapshot)
        code_files, held_out = split_files(workspace_files(snapshot))
        if not code_files:
            raise ValueError(f"{repo}: no code files to complete at {chosen[-1][:12]}")
        completions = {
            "snapshot": str(snapshot),
            "commit": chosen[-1],
            "train_files": len(code_files),
            "held_out_files": held_out,
        }
    trainable = load_trainable(model, cache_dir, settings)
    tokenizer = trainable.tokenizer

    def count_tokens(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    points, counts = replay_commits(
        history,
        chosen,
        ReplaySettings(window_lines=next_edit.window_lines, suffixes=suffixes),
        token_windows(count_tokens, next_edit),
    )
    # The trainer keeps the last three quarters of its prompt budget for the text before the
    # middle; a longer prompt would lose its first edits, so it is not an example.
    examples, made = replay_examples(
        points,
        count_tokens,
        next_edit,
        max_prompt_tokens=settings.edit_prompt_tokens,
        no_change_share=no_change_share,
        seed=settings.seed,
    )
    if not examples:
        raise ValueError(f"{repo}: no training examples in {history.describe_range(chosen)}")
    # A next-edit example is read verbatim whatever the template; completions take the model's.
    template = template_for(trainable.family) if completion_share > 0 else EDIT_TEMPLATE
    trainer = Trainer(
        trainable.model,
        tokenizer,
        template,
        trainable.base_model_id,
        settings,
        work_dir,
        device=device,
    )

    def stream() -> Iterator[FimExample]:
        edits = stream_edit_examples(examples, settings.seed)
        if completion_share == 0:
            return edits
        code = stream_code_examples(work_dir / SNAPSHOT, code_files, settings.seed)
        if completion_share == 1:
            return code
        return mixed_stream(edits, code, completion_share)

    result = trainer.run(stream, budget, on_progress)
    trained = EditTraining(
        str(repo.resolve()),
        history.describe_range(chosen),
        chosen,
        counts.summary(),
        made.summary(),
        no_change_share,
        completion_share,
        completions,
    )
    write_edit_training(Path(result.adapter), trained.record())
    return result, trained


def same_shares(work_dir: Path, shares: dict[str, float]) -> None:
    """Refuse to resume the run in `work_dir` with other shares of examples than it started
    with (the trainer's checkpoints would go on with a stream it never read); a new run
    records them."""
    path = work_dir / SHARES
    if path.is_file():
        started = json.loads(path.read_text(encoding="utf-8"))
        if started != shares:
            raise ValueError(
                f"{work_dir} holds a run started with {started}, not {shares}: "
                "run it again with the same shares, or with --fresh"
            )
        return
    work_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(shares) + "\n", encoding="utf-8")


def export_snapshot(history: GitHistory, commit: str, directory: Path) -> None:
    """The repository's files at `commit` in `directory` (kept when it is already that commit's:
    a resumed run reads the same files)."""
    marker = directory / ".commit"
    if marker.is_file() and marker.read_text(encoding="ascii").strip() == commit:
        return
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    # Streamed from git into the directory: a large repository is never held in memory whole.
    with subprocess.Popen(
        ["git", "-C", str(history.repo), "archive", "--format=tar", commit],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as archive:
        assert archive.stdout is not None and archive.stderr is not None
        try:
            with tarfile.open(fileobj=archive.stdout, mode="r|") as tar:
                tar.extractall(directory, filter="data")
        except tarfile.TarError as exc:
            failed: str | Exception = exc
        else:
            failed = ""
        errors = archive.stderr.read().decode(errors="replace").strip()
        if archive.wait() != 0 or failed:
            raise ReplayError(f"git archive {commit[:12]}: {errors or failed}")
    marker.write_text(commit + "\n", encoding="ascii")
