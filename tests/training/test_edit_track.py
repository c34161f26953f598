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
from training.registry import (
    REGISTRY_FILE,
    RUN_DIR,
    AdapterRegistry,
    AdapterRegistryError,
    promotion_decision,
    scope_dir,
)
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


def judged(n: int, low: float) -> dict[str, Any]:
    """A next-edit version's judgement on `n` held-out windows, the gain's 95% lower bound `low`."""
    windows = {"n": n, "mean": low + 0.1, "ci95_low": low, "ci95_high": low + 0.2}
    return {
        "task": "next-edit",
        "n": 0,
        "exact_line_difference": {"n": 0, "mean": 0.0, "ci95_low": 0.0, "ci95_high": 0.0},
        "next_edits": {"exact_window_difference": windows},
    }


def test_a_next_edit_version_is_promoted_on_its_next_edits_alone() -> None:
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


def turn_down(registry: AdapterRegistry, version: int) -> None:
    """Judge `version` against what serves, with no gain: the registry rejects it."""
    registry.record_evaluation(version, {"against": registry.serving(), **judged(20, -0.1)})
    with pytest.raises(AdapterRegistryError, match="not promoting"):
        registry.promote(version)
    assert registry.get(version).status == "rejected"


def test_a_run_reads_on_past_the_last_run_from_the_same_weights_that_was_turned_down(
    workspace: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = workspace
    argv = ("train", "model", "--task", "next-edit", "--workspace", str(root), *TRAIN)
    registry = edit_registry(cache_dir(), root)

    def train() -> dict[str, Any]:
        return run(capsys, *argv, "--eval-n", "0", "--json")

    def read(report: dict[str, Any]) -> tuple[int, int, int, int]:
        found = report["edit_examples"]["history"]["read"]
        return found["lap"], found["unread_at_start"], found["read"], found["lap_after"]

    # Six examples, four read a run. A fresh version turned down against the base model: the
    # next fresh run reads the two it left, then starts lap 1, where before it read the same
    # four again from the same weights.
    first = train()
    turn_down(registry, 1)
    second = train()
    assert first["warm_start"]["from"] is None and second["warm_start"]["from"] is None
    assert (read(first), read(second)) == ((0, 6, 4, 0), (0, 2, 4, 1))

    # From a serving version: v0003, from v0002, reads lap 1's other four and is turned down,
    # so v0004, from v0002 again, starts lap 2 where v0003 stopped, rather than read lap 1's four
    # again as v0003 did.
    registry.promote(2, force=True)
    third = train()
    turn_down(registry, 3)
    fourth = train()
    assert third["warm_start"]["from"] == fourth["warm_start"]["from"] == "v0002"
    assert (read(third), read(fourth)) == ((1, 4, 4, 1), (1, 0, 4, 2))
    started = [registry.get(v).train["warm_start"]["from"] for v in (1, 2, 3, 4)]
    assert started == [None, None, "v0002", "v0002"]
    records = [read_edit_training(registry.path(v)) or {} for v in (1, 2, 3, 4)]
    laps = [(r["history_read"]["lap"], len(r["history_read"]["keys"])) for r in records]
    assert laps == [(0, 4), (1, 2), (1, 6), (2, 4)]

    # A version whose registry entry does not say where its run started from is not taken for
    # a run from the same weights.
    state_file = registry.root / REGISTRY_FILE
    state = json.loads(state_file.read_text())
    del next(v for v in state["versions"] if v["version"] == 4)["train"]["warm_start"]
    state_file.write_text(json.dumps(state))
    fifth = train()
    assert read(fifth)[:2] == (1, 0)  # where v0003 stopped (after v0004: lap 2, two unread)
