"""The whole loop end to end: tiny model, real engine, telemetry client, backend, trainer,
registry and policy client, on a small corpus of real files."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import psutil
import pytest

from evaluation.replay import build_parser, run
from evaluation.replay.continuous import training_summary
from evaluation.simulation import hole_length, sample_positions, simulated_user

ROOT = Path(__file__).resolve().parents[2]

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def _corpus(root: Path, *names: str) -> Path:
    root.mkdir()
    for name in names:
        shutil.copy(STDLIB / name, root / name)
    return root


@pytest.mark.parametrize(
    ("suggestion", "kind", "accepted", "retained"),
    [
        pytest.param("return x\n", "accepted", 9, 9, id="exact"),
        pytest.param("return x\nfoo()", "accepted", 14, 13, id="first-line-right"),
        pytest.param("return y", "partial", 7, 7, id="right-prefix"),
        pytest.param("ret", "accepted", 3, 3, id="short-but-right"),
        pytest.param("pass", "ignored", 0, 0, id="wrong"),
    ],
)
def test_simulated_user(suggestion: str, kind: str, accepted: int, retained: int) -> None:
    response = simulated_user(suggestion, "return x\nfoo(1)\n")
    assert (response.kind, response.accepted_chars, response.retained_chars) == (
        kind,
        accepted,
        retained,
    )


def test_positions_are_reproducible_and_truthful(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "c", "colorsys.py", "bisect.py")
    first = sample_positions(corpus, 20, seed=3)
    assert first == sample_positions(corpus, 20, seed=3)
    for position in first:
        text = Path(position.path).read_text(encoding="utf-8")
        assert position.prefix + position.truth == text
        request = position.request()
        # The file goes on after the hole: hole + suffix is the rest of the file, the hole is
        # the rest of the cursor's line (less brackets the editor closed), never empty.
        assert position.hole + request.suffix == position.truth
        assert position.hole.strip() and "\n" not in position.hole
        assert request.suffix == "" or request.suffix.startswith(("\n", ")", "]", "}", " "))
    # Brackets opened on the line stand after the cursor as an editor closes them, and the
    # request gets the single-line stop rule.
    assert any(p.request().line_suffix.strip() for p in first)


@pytest.mark.parametrize(
    ("prefix", "truth", "hole"),
    [
        pytest.param("x = f(", "a, b)\ny = 1\n", "a, b", id="auto-closed-paren"),
        pytest.param("x = f(g(", "a))\n", "a", id="two-closers"),
        pytest.param("x = f(", "a, b):\n", "a, b):", id="code-after-the-closer"),
        pytest.param("    ", "return x\n", "return x", id="indent"),
        pytest.param("x = f(", ")\n", ")", id="nothing-but-closers"),
        pytest.param("x = (", "1)  \nz", "1", id="trailing-space"),
    ],
)
def test_hole_length(prefix: str, truth: str, hole: str) -> None:
    assert truth[: hole_length(prefix, truth)] == hole


def test_replay_runs_the_whole_loop(tmp_path: Path, tiny_model_path: Path) -> None:
    train = _corpus(tmp_path / "train", "textwrap.py", "fnmatch.py")
    test = _corpus(tmp_path / "test", "colorsys.py")
    argv = [
        "--train",
        str(train),
        "--test",
        str(test),
        "--rounds",
        "2",
        "--train-positions",
        "30",
        "--test-positions",
        "12",
        "--model",
        str(tiny_model_path),
        "--max-new-tokens",
        "8",
        "--context-tokens",
        "256",
        "--cache",
        str(tmp_path / "gen.jsonl"),
        "--train-interval",
        "0.5",
        "--refresh",
        "0.2",
        "--eval-draws",
        "2",
    ]
    report = run(build_parser().parse_args(argv), argv)

    rounds = report["rounds"]
    held_out = report["held_out"]
    seen = report["training_corpus"]
    # Every request asked the output cache once (the replay turns the typing-through cache off),
    # and the model ran once per position: each later play of a position, in a round or an
    # evaluation, was answered with the output of its first play.
    corpus = report["corpus"]
    assert (corpus["train_positions"], corpus["test_positions"]) == (30, 12)
    draws = report["settings"]["eval_draws"]  # held-out and training-corpus figures are per draw
    summary = report["summary"]
    drill = summary["canary_rollback"]
    requests = (
        sum(r["requests"] for r in rounds)
        + draws * sum(figures["requests"] for figures in held_out.values())
        + draws * report["held_out_before_prompt_fix"]["requests"]
        + draws * (seen["baseline"]["requests"] + seen["learned"]["requests"])
        + drill["decisions_played"]
    )
    cache = report["model_cache"]
    # Positions after typed indentation have a second prompt: the one without the prompt fix.
    indented = sum(1 for p in sample_positions(test, 12, 1) if p.prefix.split("\n")[-1].isspace())
    assert cache["misses"] == 30 + 12 + indented
    assert cache["hits"] + cache["misses"] == requests
    assert [r["round"] for r in rounds] == [1, 2]
    # The trainer read each round's events from the backend (they went through telemetry).
    assert [r["trained"]["events"] for r in rounds] == [30, 60]
    assert all(r["trained"]["candidate"] for r in rounds)
    base = held_out["always_show"]
    assert base["shown"] == base["suggestions"]
    for figures in held_out.values():
        assert 0.0 <= figures["accept_rate"] <= 1.0
        assert figures["retained_chars"] <= figures["accepted_chars"]
        assert figures["shown"] <= figures["suggestions"] <= figures["requests"] == 12
    assert set(summary) >= {
        "shown_change_pct",
        "accept_rate_change_pct",
        "full_accept_rate_change_pct",
        "accepted_chars_change_pct",
        "reward_gain_lower_bound",
        "vs_builtin",
        "event_to_serving_s",
        "prompt_fix",
    }
    for figures in [*held_out.values(), report["held_out_before_prompt_fix"]]:
        assert 0.0 <= figures["full_accept_rate"] <= figures["accept_rate"]
        assert figures["full_accept_rate"] + figures["partial_accept_rate"] == pytest.approx(
            figures["accept_rate"]
        )
    # Every promotion of the scheduler is reported, whenever its run happened (the drill's bad
    # candidate is not one); each was timed from the newest event it read to its first serving.
    promoted = summary["promoted"]
    assert summary["promotions"] == len(promoted)
    assert drill["version"] not in {p["version"] for p in promoted}
    assert {r["promoted"] for r in rounds if r["promoted"]} <= {p["version"] for p in promoted}
    if promoted:
        delays = [p["event_to_serving_s"] for p in promoted]
        assert all(delay is not None and delay >= 0 for delay in delays)
        assert summary["event_to_serving_s"] == max(delays)
    else:  # too little data to promote: the report says so instead of a bare null
        assert summary["event_to_serving_s"] is None
        assert summary["event_to_serving_note"] == "no training run promoted a candidate"
    # The canary drill: a candidate with the wrong sign was rolled back by the trainer itself.
    assert drill["rolled_back"], drill
    assert drill["seconds_to_rollback"] > 0
    assert drill["figures"]["gain"] < 0
    assert seen["baseline"]["requests"] == 30
    assert seen["baseline"]["shown"] == seen["baseline"]["suggestions"]
    assert seen["learned"]["shown"] <= seen["baseline"]["shown"]
    assert corpus["train_files"] == 2 and corpus["test_files"] == 1


def test_the_model_loop_trains_an_adapter_on_code_and_feedback_and_serves_it(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    train = _corpus(tmp_path / "train", "textwrap.py", "fnmatch.py")
    test = _corpus(tmp_path / "test", "colorsys.py")
    argv = [
        *("--train", str(train), "--test", str(test), "--rounds", "1"),
        *("--train-positions", "20", "--test-positions", "8", "--model", str(tiny_model_path)),
        *("--max-new-tokens", "8", "--context-tokens", "256", "--cache", str(tmp_path / "g.jsonl")),
        *("--train-interval", "0.5", "--refresh", "0.2", "--eval-draws", "1"),
        *("--model-loop-samples", "8", "--model-loop-rounds", "1", "--prompt-fix-positions", "0"),
    ]
    report = run(build_parser().parse_args(argv), argv)

    loop = report["model_loop"]
    first = report["rounds"][0]
    # Each suggestion shown in the first round, and judged, was kept as the server keeps it.
    assert loop["feedback_rows"] == sum(loop["feedback_outcomes"].values())
    assert 0 < loop["feedback_rows"] <= first["shown"]
    assert set(loop["feedback_outcomes"]) <= {"accepted", "partial", "ignored", "dismissed"}
    assert loop["training"]["samples"] == 8 and loop["training"]["steps"] == 1
    # The adapted model served the held-out plays: its own model id, its own outputs.
    assert loop["model"] != report["model"] and "+" in loop["model"].removeprefix(report["model"])
    assert report["model_cache"]["misses"] >= 20 + 8 + 8 + 20
    # One more round of the gate's loop ran on the adapted model's suggestions, after the others.
    assert [r["round"] for r in loop["rounds"]][:1] == [len(report["rounds"]) + 1]
    assert loop["rounds"][0]["requests"] == 20 and loop["rounds"][0]["trained"]["events"] > 20
    assert set(loop["held_out"]) == {"always_show", "learned", "relearned"}
    for figures in loop["held_out"].values():
        assert figures["requests"] == 8
        assert figures["shown"] <= figures["suggestions"] <= 8
    summary = loop["summary"]
    assert (
        summary["adapted_always_show_vs_base_always_show"]["baseline"]
        == (report["held_out"]["always_show"])
    )
    assert summary["adapted_learned_vs_base_learned"]["baseline"] == report["held_out"]["learned"]


def test_the_held_out_split_is_the_adapter_trainers(tmp_path: Path) -> None:
    from training.examples import is_held_out, split_files, workspace_files

    root = _corpus(tmp_path / "code", *(p.name for p in sorted(STDLIB.glob("[a-f]*.py"))[:12]))
    train, held = split_files(workspace_files(root))
    assert train and held  # twelve files: both sides have some
    learn = sample_positions(root, 60, 0, keep=lambda f: not is_held_out(f))
    report = sample_positions(root, 30, 1, keep=is_held_out)
    assert {Path(p.path).name for p in learn} <= set(train)
    assert {Path(p.path).name for p in report} <= set(held)
    assert len(report) == 30


def test_the_replay_wants_one_held_out_corpus(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "c", "colorsys.py")
    with pytest.raises(SystemExit, match="not both"):
        run(
            build_parser().parse_args(
                ["--train", str(corpus), "--test", str(corpus), "--held-out-split"]
            ),
            [],
        )
    with pytest.raises(SystemExit, match="is needed"):
        run(build_parser().parse_args(["--train", str(corpus)]), [])


def test_the_continuous_loop_reveals_the_code_base_and_trains_between_rounds(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    code = _corpus(tmp_path / "code", "textwrap.py", "fnmatch.py", "colorsys.py", "bisect.py")
    argv = [
        *("--continuous", "--train", str(code), "--rounds", "2", "--round-positions", "10"),
        *("--sessions-per-round", "2", "--model", str(tiny_model_path)),
        *("--max-new-tokens", "8", "--context-tokens", "256", "--cache", str(tmp_path / "g.jsonl")),
        *("--train-interval", "0.5", "--refresh", "0.2", "--eval-draws", "1"),
        # The server's loop with a run that fits a test: a few examples, due at once.
        *("--loop-setting", "budgetSamples=4", "--loop-setting", "budget=5m"),
        *("--loop-setting", "minChangedFiles=1", "--loop-setting", "idleS=0"),
        *("--loop-setting", "checkEveryS=1", "--loop-setting", "evalCursors=4"),
    ]
    report = run(build_parser().parse_args(argv), argv)

    first, second = report["rounds"]
    # Each round typed in its own newly revealed files, two of the four each.
    assert first["files_revealed"] == second["files_revealed"] == 2
    assert first["positions"] == second["positions"] == 10
    for entry in (first, second):
        assert entry["live"]["requests"] == entry["base_always_show"]["requests"] == 10
        assert entry["base_always_show"]["shown"] == entry["base_always_show"]["suggestions"]
        assert sum(entry["serving"]["model_requests"].values()) == 10
    # The first round was served by the base model; the server's own command ran after it.
    assert set(first["serving"]["model_requests"]) == {"base"}
    run_ = first["training"]
    assert run_["ran"] and run_["exit"] == 0, run_
    assert run_["changed_files"] == 2  # the files revealed so far, all new before a first run
    assert run_["waits_s"] == 1.0  # idle 0 s and one look (checkEveryS) skipped on the clock
    assert run_["report"]["training"]["samples"] >= 4  # whole optimiser steps
    assert run_["outcome"] in ("promoted", "not promoted")
    if run_["outcome"] == "promoted":  # it served the second round's sessions on its arm
        assert f"workspace:{run_['version']}" in second["serving"]["model_requests"]
        assert run_["event_to_serving_s"] >= run_["run_s"]
        assert report["summary"]["event_to_serving_s"] == [run_["event_to_serving_s"]]
    # The last round is not followed by a run; the settings say what differs from the defaults.
    assert "training" not in second
    assert report["settings"]["training_loop_changed_from_defaults"] == {
        "budget": "5m",
        "budget_samples": 4,
        "min_changed_files": 1,
        "idle_s": 0.0,
        "check_every_s": 1.0,
        "eval_cursors": 4,
    }
    summary = report["summary"]
    assert summary["training_checks"] == summary["runs"] == 1
    assert len(summary["reward_gain_per_position_by_round"]) == 2
    pooled = summary["rounds_after_the_first_vs_base_always_show"]
    assert pooled["baseline"]["requests"] == pooled["loop"]["requests"] == 10


def test_the_summary_counts_only_runs_that_ran() -> None:
    """A look that found the loop waiting (for a canary's verdict, say) is not a run."""
    waited = {"ran": False, "waiting_for": "the verdict on the canary v0001"}
    promoted = {"ran": True, "outcome": "promoted", "event_to_serving_s": 2476.2}
    refused = {"ran": True, "outcome": "not promoted"}
    rounds = [
        {"round": 1, "training": promoted},
        {"round": 2, "training": waited},
        {"round": 3, "training": refused},
        {"round": 4},  # the last round: no look after it
    ]
    assert training_summary(rounds) == {
        "training_checks": 3,
        "runs": 2,
        "promoted": 1,
        "event_to_serving_s": [2476.2],
        "event_to_serving_max_s": 2476.2,
    }
    assert training_summary([{"round": 1}])["event_to_serving_max_s"] is None


def _is_training_run(process: psutil.Process) -> bool:
    try:
        command = process.cmdline()
    except psutil.Error:  # a short-lived helper, already gone
        return False
    return "train" in command and "model" in command


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and SIGTERM")
def test_sigterm_stops_the_continuous_replay_and_the_run_it_waits_for(
    tmp_path: Path, tiny_model_path: Path
) -> None:
    code = _corpus(tmp_path / "code", "textwrap.py", "fnmatch.py")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    argv = [
        *("--continuous", "--train", str(code), "--rounds", "2", "--round-positions", "10"),
        *("--sessions-per-round", "1", "--model", str(tiny_model_path)),
        *("--max-new-tokens", "8", "--context-tokens", "256", "--cache", str(tmp_path / "g.jsonl")),
        *("--train-interval", "0.5", "--refresh", "0.2", "--eval-draws", "1"),
        # A run that goes on until it is stopped: due at once, a long budget.
        *("--loop-setting", "budget=30m", "--loop-setting", "minChangedFiles=1"),
        *("--loop-setting", "idleS=0", "--loop-setting", "checkEveryS=1"),
    ]
    replay = subprocess.Popen(
        [sys.executable, "-m", "tabloop", "eval", "replay", *argv, "--json"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(scratch)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    parent = psutil.Process(replay.pid)
    try:
        child = None
        for _ in range(1200):  # the first round, then the server's own command starts
            child = next((c for c in parent.children() if _is_training_run(c)), None)
            if child is not None or replay.poll() is not None:
                break
            time.sleep(0.1)
        assert child is not None, "the replay started no training run"
        assert list(scratch.glob("tabloop-replay-*"))  # its working files, while it runs
        replay.send_signal(signal.SIGTERM)
        assert replay.wait(timeout=120) == 143
        child.wait(timeout=60)  # raises if the run outlives the replay
        assert not list(scratch.glob("tabloop-replay-*"))
    finally:
        for process in (replay, *([child] if child is not None else [])):
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                process.kill()
