"""The workspace's next-edit track: `tabloop train model --task next-edit` trains on the
workspace's git history and the user's kept edits, judges on held-out ones, and keeps its
versions in a registry of their own; end to end on the tiny model and a repository built here."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from common.paths import CACHE_DIR_VARIABLE
from tabloop.cli import main
from tests.evaluation.test_eval_edits import rename_repo
from tests.support.git_repo import git
from training.edit_examples import EditExample, read_edit_training
from training.edit_replay import GitHistory
from training.edit_store import EditExampleStore
from training.edit_track import EDIT_TRACK, edit_registry, history_head, split_commits
from training.feedback import FEEDBACK_FILE
from training.registry import REGISTRY_FILE, RUN_DIR, promotion_decision, scope_dir
from training.workspace import PLAN_FILE, RunPlan


@pytest.fixture
def workspace(tmp_path: Path, tiny_model_path: Path) -> tuple[Path, list[str]]:
    root = tmp_path / "ws"
    return root, rename_repo(root, tiny_model_path)


def cache_dir() -> Path:
    return Path(os.environ[CACHE_DIR_VARIABLE])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(list(argv)) == 0
    found: dict[str, Any] = json.loads(capsys.readouterr().out)
    return found


TRAIN = ("--samples", "4", "--effective-batch", "2", "--micro-batch", "1", "--rank", "4")


def test_the_newest_commits_judge_and_the_older_train(
    workspace: tuple[Path, list[str]],
) -> None:
    root, ids = workspace
    history = GitHistory(root)
    trained, judged = split_commits(history, ids[-1], count=200, judged=3)
    assert (trained, judged) == (ids[:-3], ids[-3:])
    # A short history: at least half of it is trained on.
    trained, judged = split_commits(history, ids[3], count=200, judged=10)
    assert (trained, judged) == (ids[:2], ids[2:4])
    assert history_head(root) == ids[-1]
    assert history_head(root.parent) is None  # not a repository


def test_a_next_edit_version_trains_on_history_and_kept_edits_apart_from_completions(
    workspace: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    root, ids = workspace
    store = EditExampleStore(cache_dir() / FEEDBACK_FILE, workspace=root)
    for n in range(10):
        store.record(EditExample("m.py", f"prompt {n}\n", "x = 1\n", f"x = {n}\n", "live"))
    store.close()
    report = run(
        capsys,
        *("train", "model", "--task", "next-edit", "--workspace", str(root), *TRAIN),
        *("--eval-n", "3", "--promote", "--json"),
    )
    assert report["task"] == "next-edit" and report["version"] == "v0001"
    assert report[
        "command"
    ] == f"tabloop train model --task next-edit --workspace {root} " + " ".join(
        (*TRAIN, "--eval-n", "3", "--promote", "--json")
    )
    examples = report["edit_examples"]
    assert (examples["stored"], examples["held_out"], examples["upto_id"]) == (10, 1, 10)
    history = examples["history"]
    assert history["head"] == ids[-1]
    # Nine commits touching Python: the newest four judge (half of a short history at most).
    assert history["train"]["commits"] == 5 and history["judged"]["commits"] == 4
    assert history["train"]["range"] == f"{ids[0][:12]}^..{ids[4][:12]}"
    assert history["train"]["examples"]["edit"] == 4  # the first commit adds the file
    assert report["training"]["samples"] == 4
    # Judged against the base model on the kept example it held out and the judged commits'.
    evaluation = report["evaluation"]
    assert evaluation["task"] == "next-edit" and evaluation["against"] is None
    assert evaluation["next_edits"]["n"] == 1 + 3
    assert evaluation["n"] == 0  # no completions judged: the track learns next edits alone
    allowed, why = promotion_decision(evaluation, 0.0)
    assert ("promoted" in report) == allowed
    assert report.get("promoted", report.get("not_promoted", "")).endswith(why)

    # Its own registry: the completion adapters' has no version, and the run directory is gone.
    completion = scope_dir(cache_dir(), workspace=root)
    assert not (completion / REGISTRY_FILE).exists()
    registry = edit_registry(cache_dir(), root)
    assert registry.root == completion / EDIT_TRACK
    assert [v.name for v in registry.versions()] == ["v0001"]
    assert not (registry.root / RUN_DIR).exists()
    # It says what it trained on, as `tabloop train edits` does, for `tabloop eval edits`.
    trained_on = read_edit_training(registry.path(1))
    assert trained_on is not None and trained_on["commits_list"] == ids[:5]
    assert trained_on["range"] == history["train"]["range"] and trained_on["live_examples"] == 9
    listed = run(capsys, "model", "list", "--task", "next-edit", "--workspace", str(root), "--json")
    assert [v["name"] for v in listed["versions"]] == ["v0001"]
    assert listed["serving"] == (1 if allowed else None)
    plain = run(capsys, "model", "list", "--workspace", str(root), "--json")
    assert plain["versions"] == []

    # `tabloop model evaluate --task next-edit` judges it again on the same held-out examples.
    again = run(
        capsys,
        *("model", "evaluate", "1", "--task", "next-edit", "--workspace", str(root)),
        *("--n", "3", "--json"),
    )
    assert again["task"] == "next-edit" and again["command"].startswith("tabloop model evaluate 1")
    assert again["next_edits"]["n"] == (1 + 3 if not allowed else 3)  # v0001 serves: seen by it


def test_a_workspace_without_history_or_kept_edits_is_a_clear_error(
    tmp_path: Path, tiny_model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "plain"
    root.mkdir()
    (root / "a.py").write_text("x = 1\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="no next-edit examples to train on"):
        main(
            [
                *("train", "model", "--task", "next-edit", "--workspace", str(root)),
                *("--model", str(tiny_model_path), *TRAIN, "--json"),
            ]
        )
    # Nothing was started: the loop finds no run to resume.
    assert not (edit_registry(cache_dir(), root).root / RUN_DIR / PLAN_FILE).exists()


def test_a_run_plan_keeps_the_head_it_started_from(
    workspace: tuple[Path, list[str]], tmp_path: Path
) -> None:
    root, ids = workspace
    plan = RunPlan.new(None, 0, 7, head=ids[-1])
    plan.save(tmp_path / "run")
    assert RunPlan.load(tmp_path / "run") == plan
    git(root, "commit", "-q", "--allow-empty", "-m", "later")
    assert RunPlan.load(tmp_path / "run").head == ids[-1]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--task", "next-edit", "--tenant", "t"), "--task trains a workspace's adapters"),
        (("--task", "next-edit", "--objective", "kto"), "fim objective"),
        (("--task", "sometimes"), "invalid choice"),
    ],
)
def test_bad_task_arguments_are_refused(
    argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["train", "model", *argv])
    assert message in capsys.readouterr().err


def test_a_next_edit_version_is_promoted_on_its_next_edits_alone() -> None:
    def judged(n: int, low: float) -> dict[str, Any]:
        windows = {"n": n, "mean": low + 0.1, "ci95_low": low, "ci95_high": low + 0.2}
        return {
            "task": "next-edit",
            "n": 0,
            "exact_line_difference": {"n": 0, "mean": 0.0, "ci95_low": 0.0, "ci95_high": 0.0},
            "next_edits": {"exact_window_difference": windows},
        }

    assert promotion_decision(judged(20, 0.05), 0.0)[0]
    allowed, why = promotion_decision(judged(20, 0.0), 0.0)
    assert not allowed and "exact window gain's 95% lower bound +0.0000" in why
    assert not promotion_decision(judged(20, 0.05), 0.1)[0]  # the margin applies
    allowed, why = promotion_decision(judged(0, 0.0), 0.0)
    assert not allowed and why == "no held-out next edits to judge it on"


def test_a_warm_started_version_reads_the_history_where_its_predecessor_stopped(
    workspace: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = workspace
    argv = ("train", "model", "--task", "next-edit", "--workspace", str(root), *TRAIN)
    first = run(capsys, *argv, "--eval-n", "0", "--json")
    registry = edit_registry(cache_dir(), root)
    registry.promote(1, force=True)
    second = run(capsys, *argv, "--eval-n", "0", "--json")
    assert second["warm_start"]["from"] == "v0001"

    examples = first["edit_examples"]["history"]["train"]["examples"]
    assert examples["edit"] + examples["no_change"] == 6
    one, two = (r["edit_examples"]["history"]["read"] for r in (first, second))
    assert one == {
        **{"lap": 0, "unread_at_start": 6, "new_commits": None, "read": 4},
        **{"lap_after": 0, "unread_after": 2},
    }
    # The second reads the two examples the first did not, then starts a lap of its own.
    # (No commit is new to it: the head has not moved.)
    assert two == {
        **{"lap": 0, "unread_at_start": 2, "new_commits": 0, "read": 4},
        **{"lap_after": 1, "unread_after": 4},
    }
    read_one, read_two = (
        set(read_edit_training(registry.path(v))["history_read"]["keys"])  # type: ignore[index]
        for v in (1, 2)
    )
    assert len(read_one) == 4 and len(read_two) == 2
    assert read_edit_training(registry.path(2))["history_read"]["lap"] == 1  # type: ignore[index]
