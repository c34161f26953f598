"""A training run in a child process that a server starts, pauses, continues, stops and watches.

The language server trains the workspace's next adapter by itself
(`lsp_server.features.training_loop`): the run is `tabloop train model --workspace ROOT --promote
--json` in a process of its own, so the training code is the command's, unchanged. This module is
the server's side of that process, with no LSP in it:

- `TrainingChild` starts the command in a session of its own at the lowest CPU priority, with
  its threads capped, pauses it (SIGSTOP) while the editor wants the CPU and continues it
  (SIGCONT), reads its resident memory, and stops it (SIGCONT, SIGTERM, then SIGKILL). A child
  still running when the interpreter exits is stopped then too.
- `ProgressLog` is the file the command writes its steps and phases to (`--progress-file`), one
  JSON object a line, and `ProgressReader` reads what is new in it.
- `LoopRecord` is what the loop remembers between servers (`background/state.json` beside the
  workspace's adapter versions): the last run's start, end, outcome and version, the newest
  feedback row it could read, and the process it started (so a server that finds it alive after
  its owner died stops it, `stop_orphan`).
- `wait_reason` decides from plain numbers whether a run is due now, and if not, what it waits
  for.

The run's work directory is the command's own (`training.registry.RUN_DIR` under the workspace's
adapter directory in the cache): a run stopped for any reason resumes from its newest checkpoint
when the command runs again, in this server or the next.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import IO, Any

import psutil

from training.settings import TrainingLoopSettings
from training.trainer import Progress

log = logging.getLogger(__name__)

STATE_DIR = "background"
"""Under a workspace's adapter directory: the loop's record, lock, progress and logs."""
STATE_FILE = "state.json"
LOCK_FILE = "lock"
PROGRESS_FILE = "progress.jsonl"
REPORT_FILE = "report.json"
LOG_FILE = "train.log"
LOWEST_PRIORITY = 19
STOP_GRACE_S = 5.0
MICRO_BATCH = 1
"""Examples per forward pass in a background run: the least memory, and a fixed number, which a
run resumed by another server (with other free memory) needs to accept its checkpoints."""

# Outcomes of a run, as `LoopRecord.outcome` and `tabloop/status` give them.
PROMOTED = "promoted"
NOT_PROMOTED = "not promoted"
FAILED = "failed"
OVER_MEMORY = "stopped: over the memory cap"
INTERRUPTED = "interrupted"
"""Stopped before it ended (the server shut down, or the process was killed): it resumes."""


# -- the progress file --------------------------------------------------------------------------


class ProgressLog:
    """The writing side: `tabloop train model --progress-file FILE` appends a line per step and
    one when the run turns to judging its adapter."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._handle: IO[str] = path.open("a", encoding="utf-8")

    def _write(self, entry: dict[str, Any]) -> None:
        self._handle.write(json.dumps(entry) + "\n")
        self._handle.flush()

    def training(self, progress: Progress) -> None:
        self._write(
            {
                "phase": "training",
                "step": progress.step,
                "samples": progress.samples,
                "fraction": round(progress.fraction, 4),
                "loss": round(progress.loss, 4),
            }
        )

    def judging(self) -> None:
        self._write({"phase": "judging"})

    def close(self) -> None:
        self._handle.close()


class ProgressReader:
    """The reading side: each call to `new()` gives the complete lines written since the last."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def new(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        entries = []
        for line in complete.splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # not ours (a damaged line): skipped
            if isinstance(entry, dict):
                entries.append(entry)
        return entries


# -- the loop's record --------------------------------------------------------------------------


@dataclass
class LoopRecord:
    """What the loop keeps between servers, for one workspace."""

    last_started: float | None = None  # seconds since the epoch
    last_ended: float | None = None
    outcome: str | None = None  # PROMOTED, NOT_PROMOTED, FAILED, OVER_MEMORY, INTERRUPTED
    reason: str = ""  # why it was not promoted, failed or stopped
    version: str | None = None  # the version the run added (v0003), when it ended
    resumed_from_step: int | None = None
    steps: int | None = None
    feedback_upto: int = 0  # the newest feedback row when the last run started
    edits_upto: int = 0  # the newest next-edit example when the last run reading them started
    task: str = "both"  # what the last run (or the one in progress) trains: `train model --task`
    edits_started: float | None = None  # the last next-edit run's start (a track of its own)
    edits_head: str | None = None  # the history's head commit when that run started
    pid: int | None = None  # the process of the run in progress
    pid_created: float | None = None  # its start time, which tells it from a reused pid

    @classmethod
    def load(cls, path: Path) -> LoopRecord:
        """The record in `path`; a missing or damaged one is a fresh record (logged)."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            known = {f.name for f in fields(cls)}
            return cls(**{k: v for k, v in data.items() if k in known})
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            log.warning("starting a fresh training record: %s is damaged (%s)", path, exc)
            return cls()

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        work = path.with_name(f".{path.name}.tmp")
        work.write_text(json.dumps(asdict(self), indent=2) + "\n", encoding="utf-8")
        os.replace(work, path)

    def summary(self) -> dict[str, Any]:
        """The last run, for `tabloop/status` (camelCase keys)."""
        return {
            "task": self.task,
            "outcome": self.outcome,
            "reason": self.reason,
            "version": self.version,
            "startedAt": self.last_started,
            "endedAt": self.last_ended,
            "resumedFromStep": self.resumed_from_step,
            "steps": self.steps,
        }


def outcome_of_report(report: dict[str, Any]) -> tuple[str, str]:
    """(outcome, reason) of a finished run from the command's `--json` report."""
    if "promoted" in report:
        return PROMOTED, str(report["promoted"])
    if "not_promoted" in report:
        return NOT_PROMOTED, str(report["not_promoted"])
    if "evaluation" not in report:
        return NOT_PROMOTED, "not judged (no held-out files, or no held-out cursors asked for)"
    return NOT_PROMOTED, "judged without being promoted"


class WorkspaceLock:
    """One server trains a workspace at a time: an exclusive lock on `background/lock`, held
    while its run goes on and let go when the run ends or the server dies."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: IO[str] | None = None

    @property
    def held(self) -> bool:
        return self._handle is not None

    def acquire(self) -> bool:
        """Take the lock if no one holds it; True when this object holds it now."""
        if self._handle is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = self.path.open("a+", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            return False
        self._handle = handle
        return True

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the file lets the lock go
            self._handle = None


# -- the child process --------------------------------------------------------------------------


def train_command(
    workspace: Path,
    settings: TrainingLoopSettings,
    *,
    model: str,
    progress_file: Path,
    task: str = "both",
    python: str = sys.executable,
) -> list[str]:
    """`tabloop train model --task TASK` for one background run of `workspace` (promoting by the
    registry's rule)."""
    command = [
        python, "-m", "tabloop", "train", "model", "--task", task,
        "--workspace", str(workspace), "--model", model, "--promote", "--json",
        "--budget", settings.budget, "--micro-batch", str(MICRO_BATCH),
        "--checkpoint-every", str(settings.checkpoint_every),
        "--eval-n", str(settings.eval_cursors), "--progress-file", str(progress_file),
    ]  # fmt: skip
    if settings.budget_samples:
        command += ["--samples", str(settings.budget_samples)]
    return command


def child_environment(
    base: Mapping[str, str], threads: int, cache_dir: Path, exclude: Sequence[str]
) -> dict[str, str]:
    """The child's environment: threads capped (training's and the judging engine's), and the
    server's cache directory and index exclusions (which may come from the editor, a layer the
    command does not read)."""
    env = dict(base)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = str(threads)  # torch sizes its pool from OMP_NUM_THREADS
    env["TABLOOP_COMPLETION__THREADS"] = str(threads)  # the fast engine that judges the version
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["TABLOOP_CACHE_DIR"] = str(cache_dir)
    env["TABLOOP_INDEX__EXCLUDE"] = json.dumps(list(exclude))
    return env


def _stop_process(process: subprocess.Popen[bytes], grace_s: float) -> int:
    """SIGCONT (a stopped process cannot die of SIGTERM), SIGTERM, SIGKILL after `grace_s`;
    the exit status."""
    if process.poll() is not None:
        return process.returncode
    for sig in (signal.SIGCONT, signal.SIGTERM):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
    try:
        return process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        return process.wait()


class TrainingChild:
    """A training command in a session (process group) of its own, at the lowest priority."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.paused = False
        self.stopped_for: str | None = None  # why this side stopped it (None: it ended itself)
        # Whatever happens to the server, the child does not outlive the interpreter.
        self._finalizer = weakref.finalize(self, _stop_process, process, 1.0)
        try:
            self._ps: psutil.Process | None = psutil.Process(process.pid)
            self.created: float | None = self._ps.create_time()
        except psutil.Error:
            self._ps, self.created = None, None

    @classmethod
    def launch(
        cls, command: Sequence[str], *, env: Mapping[str, str], stdout: Path, stderr: Path
    ) -> TrainingChild:
        """Start `command` with its output in the two files, then lower its priority."""
        stdout.parent.mkdir(parents=True, exist_ok=True)
        with stdout.open("wb") as out, stderr.open("wb") as err:
            process = subprocess.Popen(
                list(command),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=dict(env),
                start_new_session=True,  # its own group: signals reach every process of it
            )
        # Niceness is per thread on Linux and inherited by new threads; the interpreter that was
        # just exec'd has started none yet.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, process.pid, LOWEST_PRIORITY)
        return cls(process)

    @property
    def pid(self) -> int:
        return self.process.pid

    def poll(self) -> int | None:
        """The exit status once it ended (negative: the signal that ended it)."""
        return self.process.poll()

    def _signal(self, sig: signal.Signals) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)

    def pause(self) -> None:
        """SIGSTOP: it takes no CPU until `resume` (its memory stays)."""
        if not self.paused:
            self._signal(signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        """SIGCONT."""
        if self.paused:
            self._signal(signal.SIGCONT)
            self.paused = False

    def rss_bytes(self) -> int:
        """Resident memory of the process and its own children (0 once it is gone)."""
        if self._ps is None:
            return 0
        try:
            processes = [self._ps, *self._ps.children(recursive=True)]
        except psutil.Error:
            return 0
        total = 0
        for process in processes:
            with contextlib.suppress(psutil.Error):
                total += process.memory_info().rss
        return total

    def stop(self, why: str, grace_s: float = STOP_GRACE_S) -> int:
        """Stop it (continued first, then SIGTERM, SIGKILL after `grace_s`); the exit status."""
        if self.process.poll() is None:
            self.stopped_for = why
        self.paused = False
        status = _stop_process(self.process, grace_s)
        self._finalizer.detach()
        return status


def process_created(pid: int) -> float | None:
    """A live process's start time (None: no such process)."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def stop_orphan(pid: int | None, created: float | None, grace_s: float = STOP_GRACE_S) -> bool:
    """Stop the run a dead server left running (the same pid *and* start time: a pid alone may
    have been reused); True when there was one."""
    if pid is None or created is None or process_created(pid) != created:
        return False
    log.info("stopping training process %d, left behind by a server that ended", pid)
    try:
        process = psutil.Process(pid)
        for sig in (signal.SIGCONT, signal.SIGTERM):
            os.killpg(pid, sig)
        try:
            process.wait(timeout=grace_s)
        except psutil.TimeoutExpired:
            os.killpg(pid, signal.SIGKILL)
            process.wait(timeout=grace_s)
    except (psutil.Error, ProcessLookupError, PermissionError):
        pass
    return True


def load_per_core() -> float:
    """The 1-minute load average divided by the CPU cores."""
    try:
        return os.getloadavg()[0] / max(os.cpu_count() or 1, 1)
    except OSError:
        return 0.0


# -- when a run is due --------------------------------------------------------------------------


@dataclass(frozen=True)
class Material:
    """What is new since the last run."""

    new_feedback: int  # feedback rows after the serving version's mark and the last run's start
    changed_files: int  # code files changed since the last run started (all, before the first)
    unfinished: bool  # a run was stopped before it ended: its checkpoints wait
    canary: str | None = None  # the version in canary, whose verdict a new run must wait for
    new_edit_examples: int = 0  # next-edit examples kept since the last run reading them started
    # Commits of the history since the last next-edit run (None: not the next-edit track's).
    new_commits: int | None = None


@dataclass(frozen=True)
class Activity:
    """How busy the editor and the machine are."""

    requests_in_flight: int
    since_last_request_s: float | None  # None: no completion asked for yet
    load_per_core: float


def enough_material(settings: TrainingLoopSettings, material: Material) -> bool:
    """Whether any kind of new material has reached its threshold."""
    return (
        material.new_feedback >= settings.min_new_feedback
        or material.new_edit_examples >= settings.min_new_edit_examples
        or material.changed_files >= settings.min_changed_files
        or (material.new_commits or 0) >= settings.min_new_commits
    )


def describe_material(settings: TrainingLoopSettings, material: Material) -> str:
    """What new material there is against what makes a run due, in words."""
    return (
        f"{material.new_feedback} of {settings.min_new_feedback} feedback rows, "
        f"{material.new_edit_examples} of {settings.min_new_edit_examples} next-edit examples, "
        f"{material.changed_files} of {settings.min_changed_files} changed files"
        + (
            f", {material.new_commits} of {settings.min_new_commits} new commits"
            if material.new_commits is not None
            else ""
        )
    )


def wait_reason(
    settings: TrainingLoopSettings,
    material: Material,
    activity: Activity,
    record: LoopRecord,
    now: float,
) -> str | None:
    """None when a run should start now; else what it waits for, in words.

    An unfinished run resumes as soon as the machine is idle, unless it failed or was stopped
    for memory (then the minimum interval applies, so it is not retried at once); a new run
    needs enough new material (feedback, next-edit examples or changed files), no adapter canary
    waiting for its verdict, and the minimum interval since the last one started."""
    left = (
        record.last_started + settings.min_interval_s - now
        if record.last_started is not None
        else 0.0
    )
    retrying = record.outcome in (FAILED, OVER_MEMORY)
    if not material.unfinished and not enough_material(settings, material):
        return f"new material: {describe_material(settings, material)}"
    if material.canary is not None and not material.unfinished:
        # A new version could not be promoted while the canary runs, and it would start from
        # the version the canary may replace.
        return f"the verdict on the canary {material.canary} (judged on the feedback)"
    if left > 0 and (retrying or not material.unfinished):
        return f"the minimum interval between runs ({left:.0f} s left)"
    if activity.requests_in_flight or (
        activity.since_last_request_s is not None
        and activity.since_last_request_s < settings.idle_s
    ):
        return f"an idle editor (no completion asked for in {settings.idle_s:g} s)"
    if activity.load_per_core >= settings.max_load:
        return (
            f"an idle machine (load {activity.load_per_core:.2f} per core, "
            f"starts below {settings.max_load:g})"
        )
    return None


def next_run(
    settings: TrainingLoopSettings,
    completion: Material,
    edits: Material | None,
    activity: Activity,
    record: LoopRecord,
    now: float,
) -> tuple[str | None, str]:
    """(task, "") when a run of `task` (`tabloop train model --task`) should start now, else
    (None, what it waits for).

    Without a next-edit track (`edits` None) every run is `both`: one adapter learns completions
    and next edits. With one, an unfinished run resumes first (the completion track's before the
    next-edit track's); else a run starts on a track whose new material is enough, the track that
    ran longer ago first. The minimum interval runs from the last run of either track, so the
    two together use the machine no more than one did."""
    if edits is None:
        reason = wait_reason(settings, completion, activity, record, now)
        return ("both", "") if reason is None else (None, reason)
    starts = [t for t in (record.last_started, record.edits_started) if t is not None]
    either = replace(record, last_started=max(starts, default=None))
    tracks = [
        ("completion", "completions", completion, record.last_started),
        ("next-edit", "next edits", edits, record.edits_started),
    ]
    unfinished = [track for track in tracks if track[2].unfinished]
    if unfinished:
        tracks = unfinished
    else:
        tracks.sort(key=lambda track: -1.0 if track[3] is None else track[3])
    reasons = []
    for task, label, material, _started in tracks:
        reason = wait_reason(settings, material, activity, either, now)
        if reason is None:
            return task, ""
        reasons.append(f"{label}: {reason}")
    return None, "; ".join(reasons)
