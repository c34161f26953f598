"""The server trains the workspace's next adapter by itself, in a child process that yields.

Once the model has loaded, every `training.checkEveryS` the loop looks whether a run is due
(`training.background.wait_reason`): enough new material (feedback rows after the serving
version's mark and the last run, or code files changed since the last run), the minimum
interval since the last run, no completion asked for in `training.idleS`, and the machine's load
below `training.maxLoad`. A run a server left unfinished (stopped, killed, or its server gone)
resumes from its checkpoint as soon as the editor and the machine are idle.

Where next edits have a runner of their own (`nextEdit.engine` resolves to `torch-bfloat16`), the
workspace's next-edit adapter is a track of its own (`training.edit_track`): a run trains either
the completion adapter on code and feedback (`--task completion`) or the next-edit adapter on the
workspace's git history and the user's kept edits (`--task next-edit`, due on new kept examples or
new commits), one at a time, the track that ran longer ago first; elsewhere one adapter learns
both (`--task both`). The next-edit feature serves the next-edit track's version as it changes.

A run is `tabloop train model --task TASK --workspace ROOT --promote --json` in a process of its own
(`training.background.TrainingChild`): the lowest CPU priority, `training.threads` threads, its
resident memory watched against `training.maxMemoryMb` (over it, it is stopped and resumes
later). While a completion request is served, and until `training.pauseAfterMs` after the last
one, it is paused (SIGSTOP) and then continued. Its steps and phases come back as `$/progress`
(training, judging, promoted or not) and as the `training` part of `tabloop/status`. When it
promotes a version, the adapters feature looks at the registry at once, so the new version
serves without waiting for its next poll. At shutdown the child is continued and stopped, never
left paused; its checkpoints stay for the next server.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from completion.next_edit.runner import next_edit_engine
from lsp_server.config import Settings
from lsp_server.features.adapters import AdapterFeature
from lsp_server.features.edit_learning import EditLearningFeature
from lsp_server.features.learning import LearningFeature
from lsp_server.progress import WorkDoneProgress
from lsp_server.protocol import TRAINING_PROGRESS_TITLE, TRAINING_PROGRESS_TOKEN_PREFIX
from lsp_server.server import ModelWork, TabloopServer
from training.background import (
    FAILED,
    INTERRUPTED,
    LOCK_FILE,
    LOG_FILE,
    OVER_MEMORY,
    PROGRESS_FILE,
    PROMOTED,
    REPORT_FILE,
    STATE_DIR,
    STATE_FILE,
    Activity,
    LoopRecord,
    Material,
    ProgressReader,
    TrainingChild,
    WorkspaceLock,
    child_environment,
    enough_material,
    load_per_core,
    next_run,
    outcome_of_report,
    stop_orphan,
    train_command,
)
from training.edit_store import EditExampleStore
from training.edit_track import edit_registry, history_of
from training.examples import workspace_files
from training.registry import (
    RUN_DIR,
    AdapterRegistry,
    AdapterRegistryError,
    scope_dir,
    version_label,
)
from training.window import mark_of
from training.workspace import PLAN_FILE

log = logging.getLogger(__name__)

WATCH_S = 1.0
"""How often a running child's progress, exit and memory are looked at."""


class TrainingLoopFeature:
    """Starts, pauses, continues, watches and stops the workspace's background training run."""

    def __init__(self, server: TabloopServer) -> None:
        self.server = server
        self.child: TrainingChild | None = None
        self.record = LoopRecord()
        self.state_dir: Path | None = None
        self.registry: AdapterRegistry | None = None
        self.edit_registry: AdapterRegistry | None = None  # the next-edit track's
        self._edit_head: str | None = None  # the history's head at the last look
        self.lock: WorkspaceLock | None = None
        self.off_reason: str | None = "not initialized"
        self.waiting_for = "the completion model to load"
        self.phase = ""  # training, judging: what the child says it does
        self.last_step: dict[str, Any] = {}
        self.pauses = 0
        self._ready = False
        self._active = 0  # completion requests in flight
        # Monotonic; the server's start counts as a request, so a run never starts the moment an
        # editor opens (its user is about to type).
        self._last_request = time.monotonic()
        self._next_check: float | None = None  # monotonic
        self._check_timer: asyncio.TimerHandle | None = None
        self._resume_timer: asyncio.TimerHandle | None = None
        self._checking = False
        self._reader: ProgressReader | None = None
        self._progress: WorkDoneProgress | None = None

    # --- settings and lifecycle ---

    def why_off(self, settings: Settings) -> str | None:
        """Why the loop cannot run with these settings (None: it may)."""
        completion = settings.completion
        if not settings.training.auto:
            return "training.auto is off"
        if self.server.workspace_root is None:
            return "the server has no workspace root"
        if not completion.enabled:
            return "completion.enabled is off"
        if completion.runner == "http":
            return "the http runner's model is not on this machine to train"
        if completion.adapter:
            return "completion.adapter names the adapter that serves"
        if completion.adapter_source == "backend":
            return "the backend's adapter serves (completion.adapterSource is backend)"
        if importlib.util.find_spec("peft") is None:
            return "peft is not installed (pip install 'tabloop[train]')"
        return None

    def on_settings(self, settings: Settings) -> None:
        root = self.server.workspace_root
        state_dir = (
            scope_dir(settings.cache_path(), workspace=root) / STATE_DIR
            if root is not None
            else None
        )
        if state_dir != self.state_dir and self.child is None:
            self.state_dir = state_dir
            self.registry = AdapterRegistry(state_dir.parent) if state_dir is not None else None
            self.edit_registry = (
                edit_registry(settings.cache_path(), root) if root is not None else None
            )
            self.lock = WorkspaceLock(state_dir / LOCK_FILE) if state_dir is not None else None
            self.record = LoopRecord.load(state_dir / STATE_FILE) if state_dir else LoopRecord()
        self.off_reason = self.why_off(settings)
        if self.off_reason is not None:
            if self.child is not None:
                self.server.run_task(self._stop(INTERRUPTED, "turned off"), "training-stop")
            self._cancel_check()
        elif self._ready and self._check_timer is None:
            self._schedule_check(0.0)

    def edit_track(self) -> bool:
        """Whether next edits train apart: where they have a runner of their own, which serves
        any adapter beside the completion engine's (one adapter for both measured worse on next
        edits: docs/next-edit.md)."""
        settings = self.server.settings
        if not settings.next_edit.enabled:
            return False
        return next_edit_engine(settings.next_edit, settings.completion) == "torch-bfloat16"

    def on_ready(self) -> None:
        """The model loaded: the loop starts looking (not before, so as not to slow the load)."""
        self._ready = True
        if self.off_reason is None and self.child is None:
            self.waiting_for = "the first look"
            self._schedule_check(0.0)

    def on_shutdown(self) -> None:
        self.off_reason = "the server is shutting down"  # no look is scheduled after this
        self._cancel_check()
        if self._resume_timer is not None:
            self._resume_timer.cancel()
        child = self.child
        if child is not None:
            code = child.stop(INTERRUPTED)
            self._finished(child, code)

    # --- yielding to typing ---

    def on_completion(self, active: bool, _kind: ModelWork) -> None:
        """A request for the model (a completion or a next edit) began or ended: pause the
        child at once, continue it when the editor has been quiet for `training.pauseAfterMs`."""
        self._last_request = time.monotonic()
        if self._resume_timer is not None:
            self._resume_timer.cancel()
            self._resume_timer = None
        if active:
            self._active += 1
            if self.child is not None and not self.child.paused:
                self.child.pause()
                self.pauses += 1
            return
        self._active = max(0, self._active - 1)
        if self._active == 0 and self.child is not None:
            delay = self.server.settings.training.pause_after_ms / 1000
            self._resume_timer = asyncio.get_running_loop().call_later(delay, self._continue)

    def _continue(self) -> None:
        self._resume_timer = None
        if self._active == 0 and self.child is not None:
            self.child.resume()

    # --- when a run is due ---

    def _schedule_check(self, delay: float) -> None:
        self._cancel_check()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._next_check = time.monotonic() + delay
        self._check_timer = loop.call_later(
            delay, lambda: self.server.run_task(self.check(), "training-check")
        )

    def _cancel_check(self) -> None:
        if self._check_timer is not None:
            self._check_timer.cancel()
        self._check_timer = None
        self._next_check = None

    async def check(self) -> None:
        """Start a run if one is due; then look again in `training.checkEveryS`."""
        self._check_timer = None
        self._next_check = None
        if self._checking or self.child is not None or self.off_reason is not None:
            return
        self._checking = True
        loop = asyncio.get_running_loop()
        try:
            split = self.edit_track()
            material = await loop.run_in_executor(None, self._material)
            edits = await loop.run_in_executor(None, self._edit_material) if split else None
            since = time.monotonic() - self._last_request
            activity = Activity(self._active, since, load_per_core())
            settings = self.server.settings.training
            record = self.record
            if record.pid is not None:  # a run was going on when its server ended
                record = replace(record, outcome=INTERRUPTED)
            task, why = next_run(settings, material, edits, activity, record, time.time())
            reason: str | None = why if task is None else None
            if task is not None:
                reason = await loop.run_in_executor(None, self._take_workspace)
            if (
                task is not None
                and reason is None
                and self.off_reason is None
                and self.child is None
            ):
                track = edits if task == "next-edit" and edits is not None else material
                if track.unfinished and task != "next-edit" and self.record.task != "next-edit":
                    task = self.record.task  # a completion run resumes as it was started
                self._start(task, resuming=track.unfinished)
            else:
                if self.child is None:
                    self._release()  # taken, but turned off meanwhile
                self.waiting_for = reason or ""
        except Exception:
            log.warning("could not look whether a training run is due", exc_info=True)
        finally:
            self._checking = False
            if self.child is None and self.off_reason is None:
                self._schedule_check(self.server.settings.training.check_every_s)

    def _material(self) -> Material:
        """What is new since the last run (reads the disk: off the event loop)."""
        registry, root = self.registry, self.server.workspace_root
        assert registry is not None and root is not None
        unfinished = (registry.root / RUN_DIR / PLAN_FILE).is_file()
        since = self.record.feedback_upto
        canary = None
        try:
            serving = registry.serving()
            mark = mark_of(registry.get(serving).train) if serving is not None else None
            running = registry.canary()
            canary = version_label(running.version) if running is not None else None
        except AdapterRegistryError:
            mark = None  # the run will say what is wrong with the registry
        if mark is not None:
            since = max(since, mark[1])
        learning = self.server.find_feature(LearningFeature)
        store = learning.store if learning is not None else None
        new_feedback = store.count_after(since) if store is not None else 0
        edits = self._edit_store()
        new_edits = 0
        if edits is not None and not self.edit_track():  # else they are the next-edit track's
            new_edits = edits.count_after(self.record.edits_upto)
        settings = self.server.settings.training
        material = Material(new_feedback, 0, unfinished, canary, new_edits)
        if not unfinished and not enough_material(settings, material):
            started = self.record.last_started
            files = workspace_files(root, self.server.settings.index.exclude)
            changed = sum(1 for rel in files if started is None or _mtime(root / rel) > started)
            material = replace(material, changed_files=changed)
        return material

    def _edit_material(self) -> Material:
        """What is new for the next-edit track: kept examples and commits since its last run
        (reads the disk and git: off the event loop)."""
        registry, root = self.edit_registry, self.server.workspace_root
        assert registry is not None and root is not None
        unfinished = (registry.root / RUN_DIR / PLAN_FILE).is_file()
        edits = self._edit_store()
        new_edits = edits.count_after(self.record.edits_upto) if edits is not None else 0
        history = history_of(root)
        # The head a run started now would read (so `_start` runs no git on the event loop).
        self._edit_head = history.git("rev-parse", "HEAD").strip() if history is not None else None
        commits = 0
        if history is not None and not unfinished:
            settings = self.server.settings.training
            since = self.record.edits_head
            span = f"{since}..HEAD" if since else "HEAD"
            try:
                commits = len(history.commits(span, settings.min_new_commits))
            except ValueError:  # the commit is gone (a rewritten history): count from none
                commits = len(history.commits("HEAD", settings.min_new_commits))
        return Material(0, 0, unfinished, None, new_edits, commits)

    def _edit_store(self) -> EditExampleStore | None:
        """The workspace's next-edit examples, when the server keeps them."""
        feature = self.server.find_feature(EditLearningFeature)
        return feature.store if feature is not None else None

    def _take_workspace(self) -> str | None:
        """Hold the workspace's lock, and stop a run its last server left running; None when
        this server may train, else why not."""
        assert self.lock is not None and self.state_dir is not None
        if not self.lock.acquire():
            return "another tabloop server training this workspace"
        self.record = LoopRecord.load(self.state_dir / STATE_FILE)
        if stop_orphan(self.record.pid, self.record.pid_created):
            self.record.outcome, self.record.reason = INTERRUPTED, "its server ended"
        return None

    # --- the run ---

    def _start(self, task: str, *, resuming: bool) -> None:
        settings, root, state_dir = self.server.settings, self.server.workspace_root, self.state_dir
        assert root is not None and state_dir is not None
        progress_file = state_dir / PROGRESS_FILE
        progress_file.unlink(missing_ok=True)
        command = train_command(
            root,
            settings.training,
            model=settings.completion.model,
            progress_file=progress_file,
            task=task,
        )
        env = child_environment(
            os.environ, settings.training.threads, settings.cache_path(), settings.index.exclude
        )
        learning = self.server.find_feature(LearningFeature)
        store = learning.store if learning is not None else None
        upto = store.last_id() if store is not None else self.record.feedback_upto
        edits = self._edit_store()
        edits_upto = edits.last_id() if edits is not None else self.record.edits_upto
        try:
            child = TrainingChild.launch(
                command, env=env, stdout=state_dir / REPORT_FILE, stderr=state_dir / LOG_FILE
            )
        except OSError as exc:
            log.warning("could not start training: %s", exc)
            self._release()
            return
        record = self.record
        record.task = task
        if resuming:  # a resumed run keeps the start and the data it was planned with
            pass
        elif task == "next-edit":
            record.edits_started, record.edits_upto = time.time(), edits_upto
            record.edits_head = self._edit_head
        else:
            record.last_started, record.feedback_upto = time.time(), upto
            if task == "both":
                record.edits_upto = edits_upto
        # The last run's outcome stays in the record (and the status) until this one ends.
        record.pid, record.pid_created = child.pid, child.created
        record.save(state_dir / STATE_FILE)
        log.info(
            "%s training (%s) in the background (process %d)",
            "resuming" if resuming else "started", task, child.pid,
        )  # fmt: skip
        self.child, self.phase, self.last_step, self.waiting_for = child, "training", {}, ""
        if self._active:  # a completion began while the workspace was being taken
            child.pause()
            self.pauses += 1
        self._reader = ProgressReader(progress_file)
        self._progress = WorkDoneProgress(
            self.server, TRAINING_PROGRESS_TOKEN_PREFIX, TRAINING_PROGRESS_TITLE
        )
        self.server.run_task(
            self._progress.begin("resuming" if resuming else "training"), "training-progress"
        )
        self.server.run_task(self._watch(child), "training-watch")

    async def _watch(self, child: TrainingChild) -> None:
        """Follow the child until it ends: its progress, and its memory against the cap."""
        loop = asyncio.get_running_loop()
        while self.child is child:
            self._read_progress()
            code = child.poll()
            if code is not None:
                self._finished(child, code)
                return
            cap = self.server.settings.training.max_memory_mb
            rss = child.rss_bytes()
            if cap and rss > cap * 1024 * 1024:
                log.warning(
                    "stopping training: %d MB resident, over training.maxMemoryMb %d",
                    rss // (1024 * 1024),
                    cap,
                )
                code = await loop.run_in_executor(None, child.stop, OVER_MEMORY)
                self._finished(child, code)
                return
            await asyncio.sleep(WATCH_S)

    async def _stop(self, why: str, detail: str) -> None:
        child = self.child
        if child is not None:
            log.info("stopping training: %s", detail)
            code = await asyncio.get_running_loop().run_in_executor(None, child.stop, why)
            self._finished(child, code)

    def _read_progress(self) -> None:
        if self._reader is None:
            return
        for entry in self._reader.new():
            phase = str(entry.get("phase", ""))
            if phase == "training":
                self.last_step = {k: entry.get(k) for k in ("step", "samples", "fraction")}
                fraction = float(entry.get("fraction") or 0.0)
                if self._progress is not None:
                    self._progress.report(
                        f"step {entry.get('step')}, {entry.get('samples')} samples",
                        int(fraction * 100),
                    )
            elif phase == "judging" and self._progress is not None:
                self._progress.report("judging against the serving version")
            self.phase = phase or self.phase

    def _finished(self, child: TrainingChild, code: int) -> None:
        """Record how the run ended; tell the adapters feature when it promoted a version."""
        if self.child is not child:
            return
        self._read_progress()
        self.child, self.phase = None, ""
        record = self.record
        report = self._report() if code == 0 else None
        record.version = record.resumed_from_step = record.steps = None
        if report is not None:
            record.outcome, record.reason = outcome_of_report(report)
            record.version = report.get("version")
            training = report.get("training") or {}
            record.resumed_from_step = training.get("resumed_from_step")
            record.steps = training.get("steps")
        elif child.stopped_for is not None:
            record.outcome, record.reason = child.stopped_for, ""
        elif code < 0:
            record.outcome, record.reason = INTERRUPTED, f"ended by signal {-code}"
        else:
            record.outcome, record.reason = FAILED, self._last_log_line(code)
        record.last_ended, record.pid, record.pid_created = time.time(), None, None
        if self.state_dir is not None:
            record.save(self.state_dir / STATE_FILE)
        self._release()
        log.info("training ended: %s %s", record.outcome, record.reason)
        if self._progress is not None:
            ended = record.outcome or ""
            if record.outcome == PROMOTED or report is not None:
                ended = f"{ended} {record.version}: {record.reason}"
            self._progress.end(ended)
            self._progress = None
        if record.outcome == PROMOTED:
            adapters = self.server.find_feature(AdapterFeature)
            if adapters is not None:
                adapters._poll_now()  # serve it now, not at the next poll
        if self.off_reason is None:
            self._schedule_check(self.server.settings.training.check_every_s)

    def _report(self) -> dict[str, Any] | None:
        assert self.state_dir is not None
        try:
            report = json.loads((self.state_dir / REPORT_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return report if isinstance(report, dict) else None

    def _last_log_line(self, code: int) -> str:
        assert self.state_dir is not None
        with contextlib.suppress(OSError):
            lines = (self.state_dir / LOG_FILE).read_text(errors="replace").strip().splitlines()
            if lines:
                return lines[-1][-300:]
        return f"exit status {code}"

    def _release(self) -> None:
        if self.lock is not None:
            self.lock.release()

    # --- status ---

    def state(self) -> str:
        if self.off_reason is not None:
            return "off"
        if self.child is None:
            return "waiting"
        if self.child.paused:
            return "paused"
        return "judging" if self.phase == "judging" else "training"

    def status_parts(self) -> dict[str, Any]:
        state = self.state()
        part: dict[str, Any] = {
            "state": state,
            "reason": self.off_reason if state == "off" else self.waiting_for,
            "lastRun": self.record.summary(),
            "nextCheckInS": (
                round(max(0.0, self._next_check - time.monotonic()), 1)
                if self._next_check is not None
                else None
            ),
        }
        if self.child is not None:
            part["run"] = {"pid": self.child.pid, "pauses": self.pauses, **self.last_step}
        part["nextEditTrack"] = self.edit_track()
        return {"training": part}


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def register(server: TabloopServer) -> None:
    feature = server.add_feature(TrainingLoopFeature(server))
    server.hooks.settings.append(feature.on_settings)
    server.hooks.ready.append(feature.on_ready)
    server.hooks.completion.append(feature.on_completion)
    server.hooks.shutdown.append(feature.on_shutdown)
