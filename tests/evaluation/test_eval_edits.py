"""`tabloop train edits` on older commits and `tabloop eval edits` on newer ones, end to end on
the tiny model and a repository built in the test."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from common.languages import SOURCE_LANGUAGES
from completion.next_edit import NextEditPredictor, NextEditSettings
from completion.next_edit.prompt import FILE_SEP
from completion.next_edit.screen import BUNDLED, load_screen
from evaluation.edits.answers import answer_record
from evaluation.edits.metrics import PredictionResult, score
from evaluation.edits.predicting import PredictionRun, predict_points
from tabloop.cli import main
from tests.support.git_repo import make_repo
from tests.support.scripted_model import ScriptedModel
from training.edit_examples import (
    edit_example,
    history_at,
    read_edit_training,
    token_windows,
    write_edit_training,
)
from training.edit_replay import GitHistory, ReplayError, ReplaySettings, replay_commits
from training.edit_training import export_snapshot

# Each commit renames one function where it is defined and, two lines below, where it is used:
# every commit makes an edit point, and a no-change point after its last hunk.
NAMES = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


def module(renamed: int) -> str:
    lines = []
    for i, name in enumerate(NAMES):
        new = f"{name}_v2" if i < renamed else name
        lines += [f"def {new}(x):\n", "    y = x + 1\n", f"    return {new}(y) if x else y\n", "\n"]
    return "".join(lines)


def rename_repo(root: Path, model: Path) -> list[str]:
    """A repository at `root` whose commits rename one function each, configured for the tiny
    `model`; its commits' ids, oldest first."""
    ids = make_repo(root, [{"m.py": module(k)} for k in range(len(NAMES) + 1)])
    # The repository's tabloop configuration (untracked: the replay reads commits only).
    (root / "tabloop.toml").write_text(
        f'[completion]\nmodel = "{model}"\nengine = "torch"\n[next_edit]\nwindow_lines = 8\n',
        encoding="utf-8",
    )
    return ids


@pytest.fixture
def repo(tmp_path: Path, tiny_model_path: Path) -> tuple[Path, list[str]]:
    root = tmp_path / "repo"
    return root, rename_repo(root, tiny_model_path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main(list(argv)) == 0
    found: dict[str, Any] = json.loads(capsys.readouterr().out)
    return found


def test_train_on_older_commits_and_judge_on_newer(
    repo: tuple[Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, ids = repo
    older, newer = f"{ids[0]}..{ids[5]}", f"{ids[5]}..{ids[8]}"
    trained = run(
        capsys,
        *("train", "edits", "--repo", str(root), "--commits", older, "--samples", "4"),
        *("--effective-batch", "2", "--micro-batch", "1", "--out", str(tmp_path / "run")),
        "--json",
    )
    assert trained["trained_on"]["range"] == f"{ids[1][:12]}^..{ids[5][:12]}"
    assert trained["trained_on"]["commit_count"] == 5
    assert trained["newer_commits"] == {"range": f"{ids[6][:12]}^..{ids[8][:12]}", "count": 3}
    # Five edit points, and five no-change points of which 30% of the whole are kept.
    assert trained["trained_on"]["examples"] == {
        "dropped_no_change_over_share": 3,
        "edit": 5,
        "no_change": 2,
    }
    assert trained["training"]["samples"] == 4
    adapter = Path(trained["adapter"])
    assert (adapter / "edit_training.json").is_file()
    # As the next-edit track writes it: where the adapter's chain stands in the history.
    record = read_edit_training(adapter)
    assert record is not None and "history_read" not in record
    record["history_read"] = {"lap": 1, "keys": ["a" * 20, "b" * 20]}
    write_edit_training(adapter, record)

    report = run(
        capsys,
        *("eval", "edits", "--repo", str(root), "--commits", newer, "--n", "4", "--seed", "1"),
        *("--adapter", str(adapter), "--compare", "--answers", str(tmp_path / "answers.jsonl")),
        "--json",
    )
    assert report["commits"]["range"] == f"{ids[6][:12]}^..{ids[8][:12]}"
    assert report["commits"]["count"] == 3
    assert report["cpu"]["cores"] == os.cpu_count()  # the machine the figures are from
    # Three commits of two hunks each: an edit point and a no-change point each; four drawn.
    assert report["replay"]["points"] == {"edit": 3, "no_change_after_last": 3}
    assert report["replay"]["languages"] == list(SOURCE_LANGUAGES)  # the default: every one
    assert report["points"]["n"] == 4
    for name in ("adapted", "base"):
        run_report = report[name]
        assert run_report["n"] == 4
        assert sum(run_report["outcomes"].values()) == 4
        assert sum(run_report["reasons"].values()) == 4
        assert run_report["latency"]["all"]["n"] == 4
        assert run_report["first_error"] is None
        configuration = run_report["configuration"]
        assert configuration["model_id"].startswith("tiny-model-v1@")
        assert configuration["engine"] == "torch"
        assert configuration["next_edit"]["window_lines"] == 8  # the repository's setting
    assert report["adapted"]["configuration"]["adapter"] == str(adapter)
    assert report["base"]["configuration"]["adapter"] is None
    trained_on = report["adapted"]["configuration"]["adapter_trained_on"]
    assert (trained_on["range"], trained_on["commit_count"]) == (trained["trained_on"]["range"], 5)
    assert "commits_list" not in trained_on
    assert trained_on["history_read"] == {"lap": 1, "read": 2}  # counted, not listed
    assert "warning" not in report["adapted"]
    paired = report["paired"]
    assert set(paired) == {
        "exact_match_ratio",
        "exact_match_ratio_all_points",
        "exact_match_ratio_all_points_ceiling",
        "points_differing",
        "outcome_changes",
    }
    ours, theirs = report["adapted"]["exact_match"], report["base"]["exact_match"]
    ratio = round(ours / theirs, 3) if ours and theirs else None
    assert paired["exact_match_ratio_all_points"] == ratio
    assert paired["exact_match_ratio_all_points_ceiling"] == (
        round(1 / theirs, 3) if theirs else None
    )
    # The screen at its default: what it answered alone, and the model at every point too.
    for name in ("adapted", "base"):
        run_report = report[name]
        screen = run_report["configuration"]["screen"]
        assert screen["file"] == str(BUNDLED)
        assert screen["trained_on"] and "screen_warning" not in run_report
        alone = run_report["reasons"].get("unlikely", 0)
        assert run_report["model_calls"] == 4 - alone
        unscreened = run_report["unscreened"]
        assert unscreened["n"] == 4 and "unlikely" not in unscreened["reasons"]
        assert unscreened["model_calls"] == 4
        assert unscreened["latency"]["model_ran"]["n"] == 4
    assert set(report["paired_unscreened"]) == set(report["paired"])

    # Every point's answers, one record a point, adding up to the report's figures.
    assert report["answers"] == {"file": str(tmp_path / "answers.jsonl"), "points": 4}
    records = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    assert len(records) == 4
    for name in ("adapted", "base"):
        runs = ((name, report[name]), (f"{name}_unscreened", report[name]["unscreened"]))
        for run_name, figures in runs:
            answers = [record["runs"][run_name] for record in records]
            assert Counter(answer["outcome"] for answer in answers) == Counter(figures["outcomes"])
            assert Counter(answer["reason"] for answer in answers) == Counter(figures["reasons"])
            upcoming = sum(answer["upcoming"] for answer in answers)
            assert upcoming - figures["outcomes"].get("exact", 0) == figures["upcoming_not_next"]
    for record in records:
        assert bool(record["expected"]) == (record["kind"] == "edit")
        if record["kind"] == "edit":  # this history's edits replace one line each
            assert [line[0] for line in record["expected"]] == ["@", "-", "+"]
        for answer in record["runs"].values():
            if answer["outcome"] == "exact":
                assert answer["upcoming"]
            if record["kind"] != "edit" or answer["outcome"] == "false_no_op":
                assert not answer["upcoming"]
            no_change = answer["outcome"] in ("false_no_op", "correct_no_op")
            assert (answer["predicted"] == []) == no_change
            assert (answer["predicted"] == record["expected"]) == (
                answer["outcome"] in ("exact", "correct_no_op")
            )

    # Without the screen the model answers every point, and nothing is asked twice.
    plain_run = run(
        capsys,
        *("eval", "edits", "--repo", str(root), "--commits", newer, "--n", "4", "--seed", "1"),
        *("--screen-below", "0", "--json"),
    )
    assert plain_run["base"]["model_calls"] == 4
    assert "unscreened" not in plain_run["base"]
    assert "screen" not in plain_run["base"]["configuration"]
    assert plain_run["base"]["outcomes"] == report["base"]["unscreened"]["outcomes"]

    # Judged on the commits it was trained on, the report says so.
    overlapping = run(
        capsys,
        *("eval", "edits", "--repo", str(root), "--commits", older, "--n", "2"),
        *("--adapter", str(adapter), "--json"),
    )
    assert overlapping["adapted"]["warning"] == "the adapter was trained on commits of this range"


def test_one_adapter_learns_completions_of_the_files_at_the_newest_commit_trained_on_too(
    repo: tuple[Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, ids = repo
    (root / "m.py").write_text("# the working tree, never trained on\n", encoding="utf-8")
    trained = run(
        capsys,
        *("train", "edits", "--repo", str(root), "--commits", f"{ids[0]}..{ids[5]}"),
        *("--samples", "4", "--effective-batch", "2", "--micro-batch", "1"),
        *("--completion-share", "0.5", "--out", str(tmp_path / "run"), "--json"),
    )
    on = trained["trained_on"]
    assert on["completion_share"] == 0.5
    snapshot = Path(on["completions"]["snapshot"])
    assert on["completions"]["commit"] == ids[5]
    assert (snapshot / "m.py").read_text(encoding="utf-8") == module(5)
    # The one file is on the training side of the hash split.
    assert (on["completions"]["train_files"], on["completions"]["held_out_files"]) == (1, [])
    assert trained["training"]["samples"] == 4
    assert trained["training"]["settings"]["max_prompt_tokens"] == 384  # a completion's
    record = json.loads((Path(trained["adapter"]) / "edit_training.json").read_text())
    assert record["completion_share"] == 0.5
    # The run directory's run goes on only with the shares it started with.
    with pytest.raises(SystemExit, match=r"started with .*'completion_share': 0.5.*--fresh"):
        main(
            [
                *("train", "edits", "--repo", str(root), "--commits", f"{ids[0]}..{ids[5]}"),
                *("--completion-share", "0.25", "--out", str(tmp_path / "run")),
            ]
        )
    with pytest.raises(ReplayError, match="not a tree object"):
        export_snapshot(GitHistory(root), "f" * 40, tmp_path / "none")


def test_bad_arguments_are_clear_errors(repo: tuple[Path, list[str]], tmp_path: Path) -> None:
    root, _ = repo
    with pytest.raises(SystemExit, match="not a git repository"):
        main(["eval", "edits", "--repo", str(tmp_path), "--n", "2"])
    with pytest.raises(SystemExit, match="a comparison needs --adapter"):
        main(["eval", "edits", "--repo", str(root), "--compare"])
    with pytest.raises(SystemExit, match="is not a directory"):
        main(["eval", "edits", "--repo", str(root), "--adapter", str(tmp_path / "none")])
    with pytest.raises(SystemExit, match="bad-range"):
        main(["eval", "edits", "--repo", str(root), "--commits", "bad-range..HEAD"])
    with pytest.raises(SystemExit):
        main(["eval", "edits", "--repo", str(root), "--screen-below", "2"])
    with pytest.raises(SystemExit, match=r"--answers .* is a directory"):
        main(["eval", "edits", "--repo", str(root), "--answers", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"completion_share must be in \[0, 1\]"):
        main(["train", "edits", "--repo", str(root), "--completion-share", "1.5"])
    with pytest.raises(SystemExit, match="no commits touching source files"):
        main(["train", "edit-screen", "--repo", str(root), "--commits", "HEAD..HEAD"])
    with pytest.raises(SystemExit, match="no commits touching source files"):
        main(["eval", "edit-screen", "--repo", str(root), "--commits", "HEAD..HEAD"])
    # The repository holds Python alone: no Go commit to judge, and a language not known.
    with pytest.raises(SystemExit, match="no commits touching go files"):
        main(["eval", "edits", "--repo", str(root), "--languages", "go"])
    for command in (["eval", "edits"], ["train", "edits"], ["eval", "edit-screen"]):
        with pytest.raises(SystemExit, match="unknown language 'klingon'"):
            main([*command, "--repo", str(root), "--languages", "python,klingon"])
    with pytest.raises(SystemExit, match="cannot read the screen"):
        main(["eval", "edit-screen", "--repo", str(root), "--screen", str(tmp_path / "none")])


def test_a_screen_trained_on_older_commits_is_judged_on_newer_ones_and_served(
    repo: tuple[Path, list[str]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, ids = repo
    out = tmp_path / "screen.json"
    report = run(
        capsys,
        *("train", "edit-screen", "--repo", str(root), "--before", ids[6], "--last", "5"),
        *("--judge-repo", str(root), "--out", str(out), "--json"),
    )
    (trained,) = report["trained"]
    assert trained["range"] == f"{ids[2][:12]}^..{ids[6][:12]}"
    # Five commits of two hunks: an edit point and a no-change point each.
    assert (trained["points"], trained["edit_points"]) == (10, 5)
    newer, newest = report["judged"]
    assert newer["range"] == f"{ids[7][:12]}^..{ids[8][:12]}"  # after the training range
    assert (newer["points"], newer["edit_points"]) == (4, 2)
    assert newest["commit_count"] == 9  # the repository's newest commits, all of them here
    assert report["below"] == NextEditSettings().screen_below
    for judged in (trained, newer):
        assert 0 <= judged["answered_alone"] <= 1 and judged["auc"] is not None
    screen = load_screen(str(out))
    assert screen.to_json() == report["screen"]
    assert screen.trained_on["histories"][0]["range"] == trained["range"]

    # The eval reads that screen, and says when it judges commits the screen was trained on.
    (root / "tabloop.toml").write_text(
        (root / "tabloop.toml").read_text(encoding="utf-8") + f'screen_weights = "{out}"\n',
        encoding="utf-8",
    )
    judged = run(
        capsys,
        *("eval", "edits", "--repo", str(root), "--commits", f"{ids[3]}..{ids[5]}", "--n", "2"),
        *("--no-unscreened", "--json"),
    )
    assert judged["base"]["configuration"]["screen"]["file"] == str(out)
    assert judged["base"]["screen_warning"] == "the screen was trained on commits of this range"
    assert "unscreened" not in judged["base"]


def test_a_model_that_writes_the_next_edit_gets_full_marks(
    repo: tuple[Path, list[str]],
) -> None:
    root, _ = repo
    history = GitHistory(root)
    settings = NextEditSettings(screen_below=0)
    counter = ScriptedModel()
    points, _ = replay_commits(
        history,
        history.commits(None, 0, (".py",)),
        ReplaySettings(),
        token_windows(counter.count_tokens, settings),
    )
    right: list[PredictionResult] = []
    undoing: list[PredictionRun] = []
    for point in points:
        edit_history, _ = history_at(point.history)
        example = edit_example(
            point.path,
            point.text,
            point.cursor,
            edit_history,
            point.target,
            counter.count_tokens,
            settings,
        )
        assert example is not None
        # The prompt the predictor sends is the training example's prompt.
        model = ScriptedModel(rules={"": example.target + FILE_SEP})
        right += predict_points(NextEditPredictor(model, settings), [point]).results
        assert model.prompts == [example.prompt]
        # A model that puts the user's last edit back (every hunk here replaces one line, and
        # the window holds it): the predictor refuses it.
        latest = point.history[-1]
        back = example.current.replace(latest.inserted, latest.removed, 1)
        assert back != example.current
        model = ScriptedModel(rules={"": back + FILE_SEP})
        undoing.append(predict_points(NextEditPredictor(model, settings), [point]))
    found = score(points, right)
    for point, result in zip(points, right, strict=True):
        record = answer_record(point, {"scripted": result})["runs"]["scripted"]
        assert record["outcome"] in ("exact", "correct_no_op")
        assert record["upcoming"] == point.expects_change  # the next edit is an upcoming one
        assert record["predicted"] == answer_record(point, {})["expected"]
    due = sum(1 for p in points if p.expects_change)
    assert found["outcomes"] == {"exact": due, "correct_no_op": len(points) - due}
    assert (found["exact_match"], found["no_op_accuracy"], found["delta_chrf"]) == (1.0, 1.0, 100.0)
    assert sum(run.reasons["undo"] for run in undoing) == len(points)


def test_a_screen_refitted_on_the_workspace_history_is_replayed_against_the_bundled(
    repo: tuple[Path, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = repo
    report = run(capsys, "eval", "edit-screen", "--repo", str(root), "--below", "0.3", "--json")
    assert report["start_screen"] == "bundled" and report["below"] == 0.3
    assert report["start_screen_trained_on"] == [
        h["repo"] for h in load_screen("").trained_on["histories"]
    ]
    # The first commit adds the file; each of the eight after it changes two lines: a point with
    # an edit due, and one with none after the last.
    assert (report["history"]["points"], report["history"]["edit_points"]) == (16, 8)
    assert [run_["kind"] for run_ in report["runs"]] == ["refit", "recalibrate"]
    for run_ in report["runs"]:
        # Too few points for a refit: nothing is judged after the first refit could run.
        assert run_["refits"] == 0 and run_["adopted"] == 0
        assert run_["start"]["points"] == run_["refitted"]["points"] == 0
