"""The server's side of a background training process: starting it low, pausing and continuing
it, watching its memory, stopping it (and one a dead server left), its progress file, its record,
and when a run is due."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from training.background import (
    FAILED,
    INTERRUPTED,
    NOT_PROMOTED,
    OVER_MEMORY,
    PROMOTED,
    Activity,
    LoopRecord,
    Material,
    ProgressLog,
    ProgressReader,
    TrainingChild,
    WorkspaceLock,
    child_environment,
    next_run,
    outcome_of_report,
    stop_orphan,
    train_command,
    wait_reason,
)
from training.settings import TrainingLoopSettings
from training.trainer import Progress

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

# Busy, with its resident memory above 50 MB: what a training process looks like from outside.
BUSY = "import time\nheld = bytearray(64 << 20)\nwhile True:\n    sum(range(10000))\n"
LIMIT_S = 30.0


def state_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("State:"):
            return line.split()[1]
    raise AssertionError("no State line")


def wait_until(test: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + LIMIT_S
    while not test():
        assert time.monotonic() < deadline, f"no {what} in {LIMIT_S:.0f} s"
        time.sleep(0.02)


@pytest.fixture
def child(tmp_path: Path) -> Iterator[TrainingChild]:
    launched = TrainingChild.launch(
        [sys.executable, "-c", BUSY],
        env={"PATH": "/usr/bin:/bin"},
        stdout=tmp_path / "out",
        stderr=tmp_path / "err",
    )
    yield launched
    launched.stop("end of test", grace_s=1.0)


def test_a_child_runs_at_the_lowest_priority_in_a_group_of_its_own(child: TrainingChild) -> None:
    process = psutil.Process(child.pid)
    assert process.nice() == 19
    assert child.created == process.create_time()
    assert os.getpgid(child.pid) == child.pid  # signals go to its whole group


def test_pause_stops_the_child_and_resume_continues_it(child: TrainingChild) -> None:
    child.pause()
    wait_until(lambda: state_of(child.pid) == "T", "stopped state")
    assert child.paused
    child.resume()
    wait_until(lambda: state_of(child.pid) != "T", "running state")
    assert not child.paused


def test_the_childs_memory_is_read(child: TrainingChild) -> None:
    wait_until(lambda: child.rss_bytes() > 50 << 20, "64 MB resident")


def test_a_paused_child_is_stopped_not_left_behind(child: TrainingChild) -> None:
    child.pause()
    wait_until(lambda: state_of(child.pid) == "T", "stopped state")
    status = child.stop(OVER_MEMORY, grace_s=5.0)
    assert status == -signal.SIGTERM  # continued, then ended by SIGTERM
    assert child.stopped_for == OVER_MEMORY
    assert not psutil.pid_exists(child.pid) or psutil.Process(child.pid).status() == "zombie"


def test_a_child_that_ended_by_itself_was_not_stopped(tmp_path: Path) -> None:
    done = TrainingChild.launch(
        [sys.executable, "-c", "print('{}')"],
        env={},
        stdout=tmp_path / "out",
        stderr=tmp_path / "err",
    )
    assert done.process.wait(timeout=LIMIT_S) == 0
    assert done.stop("late") == 0 and done.stopped_for is None
    assert (tmp_path / "out").read_text().strip() == "{}"


def test_an_orphan_is_stopped_only_when_pid_and_start_time_match() -> None:
    orphan = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    try:
        created = psutil.Process(orphan.pid).create_time()
        assert not stop_orphan(orphan.pid, created + 1.0)  # a reused pid: someone else's
        assert orphan.poll() is None
        assert not stop_orphan(None, None)
        assert stop_orphan(orphan.pid, created)
        orphan.wait(timeout=LIMIT_S)  # (reaped already: here it is this process's child)
        assert not psutil.pid_exists(orphan.pid)
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()


def test_the_progress_file_gives_complete_new_lines(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    reader = ProgressReader(path)
    assert reader.new() == []  # not written yet
    writer = ProgressLog(path)
    writer.training(Progress(3, 24, 900, 2.5, 1.0, 10.0, 0.5))
    assert reader.new() == [
        {"phase": "training", "step": 3, "samples": 24, "fraction": 0.5, "loss": 2.5}
    ]
    with path.open("a") as handle:
        handle.write('{"phase": "judg')  # a line still being written
    assert reader.new() == []
    with path.open("a") as handle:
        handle.write('ing"}\nnot json\n')
    assert reader.new() == [{"phase": "judging"}]
    writer.close()


def test_the_record_survives_and_a_damaged_one_starts_fresh(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    assert LoopRecord.load(path) == LoopRecord()
    record = LoopRecord(last_started=5.0, outcome=PROMOTED, version="v0002", feedback_upto=7)
    record.save(path)
    assert LoopRecord.load(path) == record
    assert LoopRecord.load(path).summary()["version"] == "v0002"
    path.write_text("{not json")
    assert LoopRecord.load(path) == LoopRecord()
    path.write_text(json.dumps({"outcome": FAILED, "unknown": 1}))
    assert LoopRecord.load(path).outcome == FAILED


def test_one_holder_of_a_workspace_lock(tmp_path: Path) -> None:
    first, second = WorkspaceLock(tmp_path / "lock"), WorkspaceLock(tmp_path / "lock")
    assert first.acquire() and first.acquire()
    assert not second.acquire()
    first.release()
    assert second.acquire() and second.held


@pytest.mark.parametrize(
    ("report", "outcome"),
    [
        pytest.param({"evaluation": {}, "promoted": "gain"}, PROMOTED, id="promoted"),
        pytest.param({"evaluation": {}, "not_promoted": "no gain"}, NOT_PROMOTED, id="refused"),
        pytest.param({"version": "v0001"}, NOT_PROMOTED, id="not-judged"),
    ],
)
def test_the_outcome_of_a_finished_run(report: dict[str, object], outcome: str) -> None:
    assert outcome_of_report(report)[0] == outcome


def test_the_command_and_its_environment(tmp_path: Path) -> None:
    settings = TrainingLoopSettings(budget="5m", budget_samples=40, checkpoint_every=3)
    command = train_command(
        tmp_path, settings, model="bundled", progress_file=tmp_path / "p", python="py"
    )
    assert command[:5] == ["py", "-m", "tabloop", "train", "model"]
    assert command[command.index("--task") + 1] == "both"  # one adapter for both, by default
    assert "--promote" in command and "--json" in command
    for flag, value in [
        ("--budget", "5m"),
        ("--samples", "40"),
        ("--checkpoint-every", "3"),
        ("--micro-batch", "1"),
        ("--progress-file", str(tmp_path / "p")),
    ]:
        assert command[command.index(flag) + 1] == value
    assert "--samples" not in train_command(
        tmp_path, TrainingLoopSettings(), model="m", progress_file=tmp_path / "p"
    )
    edits = train_command(
        tmp_path, TrainingLoopSettings(), model="m", progress_file=tmp_path / "p", task="next-edit"
    )
    assert edits[edits.index("--task") + 1] == "next-edit"
    env = child_environment({"HOME": "/h"}, 2, tmp_path, ["gen/**"])
    assert env["OMP_NUM_THREADS"] == "2" and env["HOME"] == "/h"
    assert env["TABLOOP_COMPLETION__THREADS"] == "2"  # the judging engine's threads too
    assert env["TABLOOP_CACHE_DIR"] == str(tmp_path)
    assert json.loads(env["TABLOOP_INDEX__EXCLUDE"]) == ["gen/**"]


def test_a_bad_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="not a duration"):
        TrainingLoopSettings(budget="soon")


SETTINGS = TrainingLoopSettings(
    min_new_feedback=10,
    min_new_edit_examples=7,
    min_new_commits=3,
    min_changed_files=5,
    min_interval_s=100,
    idle_s=60,
    max_load=0.5,
)
IDLE = Activity(0, None, 0.1)
ENOUGH = Material(new_feedback=10, changed_files=0, unfinished=False)
NOW = 1000.0


@pytest.mark.parametrize(
    ("material", "activity", "record", "waits_for"),
    [
        pytest.param(ENOUGH, IDLE, LoopRecord(), None, id="feedback-enough"),
        pytest.param(Material(0, 5, False), IDLE, LoopRecord(), None, id="files-enough"),
        pytest.param(
            Material(0, 0, False, new_edit_examples=7), IDLE, LoopRecord(), None, id="edits-enough"
        ),
        pytest.param(
            Material(9, 4, False, new_edit_examples=6),
            IDLE,
            LoopRecord(),
            "6 of 7 next-edit examples",
            id="too-little",
        ),
        pytest.param(
            ENOUGH, IDLE, LoopRecord(last_started=NOW - 50), "minimum interval", id="too-soon"
        ),
        pytest.param(ENOUGH, IDLE, LoopRecord(last_started=NOW - 100), None, id="interval-over"),
        pytest.param(
            Material(10, 0, False, canary="v0002"), IDLE, LoopRecord(), "canary v0002", id="canary"
        ),
        pytest.param(Material(0, 0, True, canary="v0002"), IDLE, LoopRecord(), None, id="resume"),
        pytest.param(ENOUGH, Activity(1, 0.0, 0.1), LoopRecord(), "idle editor", id="in-flight"),
        pytest.param(ENOUGH, Activity(0, 30.0, 0.1), LoopRecord(), "idle editor", id="typing"),
        pytest.param(ENOUGH, Activity(0, 60.0, 0.1), LoopRecord(), None, id="typed-long-ago"),
        pytest.param(ENOUGH, Activity(0, None, 0.5), LoopRecord(), "idle machine", id="busy"),
        pytest.param(
            Material(0, 0, True),
            IDLE,
            LoopRecord(last_started=NOW - 1, outcome=INTERRUPTED),
            None,
            id="unfinished-resumes-at-once",
        ),
        pytest.param(
            Material(0, 0, True),
            IDLE,
            LoopRecord(last_started=NOW - 1, outcome=OVER_MEMORY),
            "minimum interval",
            id="over-memory-waits",
        ),
        pytest.param(
            Material(0, 0, True),
            Activity(0, 1.0, 0.1),
            LoopRecord(outcome=INTERRUPTED),
            "idle editor",
            id="unfinished-waits-for-idle",
        ),
    ],
)
def test_when_a_run_is_due(
    material: Material, activity: Activity, record: LoopRecord, waits_for: str | None
) -> None:
    reason = wait_reason(SETTINGS, material, activity, record, NOW)
    if waits_for is None:
        assert reason is None
    else:
        assert reason is not None and waits_for in reason


QUIET = Material(0, 0, False)
EDITS = Material(0, 0, False, new_edit_examples=7)
COMMITS = Material(0, 0, False, new_commits=3)


@pytest.mark.parametrize(
    ("completion", "edits", "record", "task", "waits_for"),
    [
        pytest.param(ENOUGH, None, LoopRecord(), "both", "", id="no-track-one-adapter"),
        pytest.param(
            Material(0, 0, False, new_edit_examples=7), None, LoopRecord(), "both", "", id="joint"
        ),
        pytest.param(QUIET, EDITS, LoopRecord(), "next-edit", "", id="kept-edits"),
        pytest.param(QUIET, COMMITS, LoopRecord(), "next-edit", "", id="new-commits"),
        pytest.param(ENOUGH, QUIET, LoopRecord(), "completion", "", id="feedback"),
        pytest.param(
            QUIET,
            Material(0, 0, False, new_edit_examples=6, new_commits=2),
            LoopRecord(),
            None,
            "next edits: new material: 0 of 10 feedback rows, 6 of 7 next-edit examples, "
            "0 of 5 changed files, 2 of 3 new commits",
            id="too-little-on-both",
        ),
        pytest.param(
            ENOUGH,
            EDITS,
            LoopRecord(last_started=NOW - 500, edits_started=NOW - 900),
            "next-edit",
            "",
            id="both-due-the-older-first",
        ),
        pytest.param(
            ENOUGH,
            EDITS,
            LoopRecord(last_started=None, edits_started=NOW - 900),
            "completion",
            "",
            id="never-ran-first",
        ),
        pytest.param(
            ENOUGH,
            EDITS,
            LoopRecord(last_started=NOW - 500, edits_started=NOW - 50),
            None,
            "minimum interval",
            id="interval-from-either-track",
        ),
        pytest.param(
            Material(0, 0, True),
            EDITS,
            LoopRecord(edits_started=NOW - 900),
            "completion",
            "",
            id="unfinished-resumes-first",
        ),
        pytest.param(
            ENOUGH,
            Material(0, 0, True),
            LoopRecord(last_started=NOW - 900, edits_started=NOW - 10, outcome=INTERRUPTED),
            "next-edit",
            "",
            id="unfinished-edit-run-resumes",
        ),
        pytest.param(
            Material(10, 0, False, canary="v0002"),
            EDITS,
            LoopRecord(),
            "next-edit",
            "",
            id="a-completion-canary-holds-only-its-track",
        ),
    ],
)
def test_which_track_runs_next(
    completion: Material,
    edits: Material | None,
    record: LoopRecord,
    task: str | None,
    waits_for: str,
) -> None:
    chosen, reason = next_run(SETTINGS, completion, edits, IDLE, record, NOW)
    assert chosen == task
    assert waits_for in reason
    if task is not None:
        assert reason == ""


def test_a_record_from_before_the_tracks_loads_as_one_adapter(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"last_started": 5.0, "edits_upto": 3}), encoding="utf-8")
    record = LoopRecord.load(path)
    assert (record.task, record.edits_started, record.edits_head) == ("both", None, None)
    assert record.summary()["task"] == "both"
