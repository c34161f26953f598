"""Versions of the adapters of one scope (a workspace, or a tenant of the backend) on disk.

The same discipline as the policy registry: every trained adapter becomes a numbered version;
a version is evaluated on held-out files before it may serve; it is promoted only when it beats
the version serving now (the base model when none) by a margin with a confidence bound, unless
forced; every promotion is remembered, so `rollback` puts the previous one back. Versions are
never deleted. The state is one JSON file, replaced atomically under a file lock.

    <root>/registry.json        {"versions": [...], "serving": 3, "history": [1, 3],
                                 "canary": {...} | null, "pending": [4], "log": [...]}
    <root>/v0003/               the adapter (completion.adapters format)

A promotion with a canary share (`promote(..., canary_share=0.1)`) does not serve the version to
everyone: it becomes the canary (`canary`), served to that share of clients (picked by
`training.canary.on_canary_arm`, `serving_for(key)`) beside the serving version until its live
outcomes judge it (`finish_canary`: it serves alone, or is rolled back). A promotion that must
be approved (`hold=True`: a tenant that requires approval) waits in `pending` for `approve`.
Every transition is logged with who made it, why, and the figures (`transitions`), for the
dashboard's time axis and `tabloop model list`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

from completion.adapters import AdapterError, verify_adapter
from telemetry.events import BASE_MODEL_VERSION
from training.canary import on_canary_arm
from training.window import window_problem

REGISTRY_FILE = "registry.json"
RUN_DIR = "runs/current"
"""Where the run in progress keeps its checkpoints, under a registry's root (`tabloop train model`
and the backend's tenant runs): a run started again there resumes."""
DEFAULT_MARGIN = 0.0
"""How far above zero the lower bound of a candidate's exact-line gain must be."""
CANARY = "canary"
PENDING = "pending-approval"
ROLLED_BACK = "rolled-back"
OPERATOR = "operator"
MAX_LOG = 1000
"""Transitions kept in the log (the oldest go first)."""


class AdapterRegistryError(ValueError):
    """A registry operation that cannot be done (unknown version, not evaluated, no gain)."""


@dataclass
class AdapterVersion:
    version: int
    created: float
    base_model: str
    status: str  # candidate, serving, retired, rejected
    train: dict[str, Any] = field(default_factory=dict)
    evaluation: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return f"v{self.version:04d}"


@dataclass(frozen=True)
class AdapterCanary:
    """A version serving a share of clients beside the serving one (None: the base model)."""

    version: int
    previous: int | None
    share: float
    started: float  # time.time()


def version_label(version: int | None) -> str:
    """A version's name as decision events carry it (`model_version`): `v0003`, or `base`."""
    return BASE_MODEL_VERSION if version is None else f"v{version:04d}"


def parse_version_label(label: str) -> int | None:
    """The version a label names (None: the base model); ValueError for anything else."""
    if label == BASE_MODEL_VERSION:
        return None
    match = re.fullmatch(r"v?(\d{1,9})", label)
    if match is None:
        raise ValueError(f"not an adapter version: {label!r}")
    return int(match.group(1))


def workspace_key(root: Path | str) -> str:
    """A workspace's identity: its root's real path (absolute, normalised, links resolved). Its
    adapters' directory and its feedback rows (`training.feedback`) are keyed by it."""
    return os.path.realpath(root)


def scope_dir(cache_dir: Path, *, workspace: Path | None = None, tenant: str | None = None) -> Path:
    """Where a workspace's (by its real path) or a tenant's adapters are kept."""
    if (workspace is None) == (tenant is None):
        raise ValueError("an adapter scope is a workspace or a tenant")
    if workspace is not None:
        key = hashlib.sha256(workspace_key(workspace).encode()).hexdigest()[:16]
        return cache_dir / "adapters" / f"workspace-{key}"
    assert tenant is not None
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", tenant):
        raise ValueError(f"not a tenant name: {tenant!r}")
    return cache_dir / "adapters" / f"tenant-{tenant}"


def promotion_decision(evaluation: dict[str, Any], margin: float) -> tuple[bool, str]:
    """Whether an evaluation (`training.evaluate.compare`) shows a gain: on the held-out files,
    the 95% lower bound of the paired exact-line difference above `margin` and above zero, and
    edit similarity not clearly worse (its paired difference's upper bound not below zero); on
    the held-out outcomes, where there are any, not clearly worse: the kept text's paired
    edit-similarity difference's upper bound not below zero, and ignored suggestions not written
    again more often (the paired difference's lower bound not above zero); on the held-out next
    edits, where there are any, exact window match not lower.

    Exact-line match is the figure that needs the gain (it was edit similarity's bound until
    the comparisons on stdlib `email` showed it the less sensitive of the two: see
    docs/learning.md). A next-edit version (`task` `next-edit`, `training.edit_track`) is judged
    on its held-out next edits alone: the 95% lower bound of the paired exact window difference
    above `margin` and above zero."""
    if evaluation.get("task") == "next-edit":
        windows = evaluation.get("next_edits", {}).get("exact_window_difference", {})
        if not windows.get("n"):
            return False, "no held-out next edits to judge it on"
        low = float(windows.get("ci95_low", float("-inf")))
        floor = max(margin, 0.0)
        if low <= floor:
            return False, (
                f"next edits' exact window gain's 95% lower bound {low:+.4f} is not above {floor}"
            )
        return True, f"next edits' exact window gain's 95% lower bound {low:+.4f} > {floor}"
    exact = evaluation.get("exact_line_difference", {})
    low = float(exact.get("ci95_low", float("-inf")))
    floor = max(margin, 0.0)
    if low <= floor:
        return False, f"exact-line gain's 95% lower bound {low:+.4f} is not above {floor}"
    similarity = evaluation.get("edit_similarity_difference", {})
    if float(similarity.get("ci95_high", 0.0)) < 0:
        return False, (
            f"edit similarity is clearly lower ({float(similarity['mean']):+.4f}, "
            f"95% upper bound {float(similarity['ci95_high']):+.4f})"
        )
    kept = evaluation.get("kept_text", {}).get("edit_similarity_difference", {})
    if float(kept.get("ci95_high", 0.0)) < 0:
        return False, (
            f"the text users kept is matched worse (edit similarity {float(kept['mean']):+.4f}, "
            f"95% upper bound {float(kept['ci95_high']):+.4f})"
        )
    ignored = evaluation.get("ignored_reproduced", {}).get("difference", {})
    if float(ignored.get("ci95_low", 0.0)) > 0:
        return False, (
            f"ignored suggestions are written again more often ({float(ignored['mean']):+.4f}, "
            f"95% lower bound {float(ignored['ci95_low']):+.4f})"
        )
    edits = evaluation.get("next_edits", {}).get("exact_window_difference", {})
    if float(edits.get("mean", 0.0)) < 0:
        return False, f"next edits' exact window match is lower ({float(edits['mean']):+.4f})"
    return True, f"exact-line gain's 95% lower bound {low:+.4f} > {floor}"


class AdapterVersions(Protocol):
    """What a registry of one scope's adapter versions offers, wherever its state is kept: a
    workspace's (`AdapterRegistry`, a JSON file under a lock) or a backend tenant's
    (`backend.adapters.registry.TenantAdapterRegistry`, in the database, its files in a blob
    store). Both refuse and allow the same transitions (`RegistryTransitions`)."""

    @property
    def root(self) -> Path:
        """The scope's local directory: version directories the trainer and the evaluation
        read, and the run in progress (`RUN_DIR`)."""
        ...

    def versions(self) -> list[AdapterVersion]: ...

    def get(self, version: int) -> AdapterVersion: ...

    def path(self, version: int) -> Path: ...

    def serving(self) -> int | None: ...

    def serving_path(self) -> Path | None: ...

    def add(self, adapter: Path, base_model: str, train: dict[str, Any]) -> AdapterVersion: ...

    def record_evaluation(self, version: int, evaluation: dict[str, Any]) -> None: ...

    def canary(self) -> AdapterCanary | None: ...

    def pending(self) -> list[int]: ...

    def transitions(self) -> list[dict[str, Any]]: ...

    def serving_for(self, key: str) -> int | None: ...

    def promote(
        self,
        version: int,
        *,
        margin: float = DEFAULT_MARGIN,
        force: bool = False,
        canary_share: float = 0.0,
        hold: bool = False,
        actor: str = OPERATOR,
    ) -> str: ...

    def approve(self, version: int, *, canary_share: float = 0.0, actor: str = OPERATOR) -> str: ...

    def finish_canary(
        self,
        *,
        promote: bool,
        version: int | None = None,
        actor: str = OPERATOR,
        reason: str = "",
        figures: dict[str, Any] | None = None,
    ) -> int | None: ...

    def rollback(self, *, actor: str = OPERATOR, reason: str = "") -> int | None: ...


def empty_state() -> dict[str, Any]:
    """The state of a registry with no versions."""
    return {
        "versions": [],
        "serving": None,
        "history": [],
        "canary": None,
        "pending": [],
        "log": [],
    }


class RegistryTransitions(ABC):
    """The transitions of a registry's state (promote, canary, approve, rollback) and its reads,
    on the state's dictionary form (the JSON file's, `empty_state`). Where the state is kept is
    the subclass's: `_locked` yields it for a change and keeps what changed, `_read` reads it;
    `_check_files` checks a version's files before it may serve."""

    root: Path

    @abstractmethod
    def _locked(self) -> AbstractContextManager[dict[str, Any]]:
        """The state, held against every other change until the block ends; what the block
        changed is kept (a log entry appended to `log` is recorded)."""

    @abstractmethod
    def _read(self) -> dict[str, Any]:
        """The state as it is now (read only)."""

    def _head(self) -> dict[str, Any]:
        """At least `serving`, `canary` and `pending` of the state as it is now."""
        return self._read()

    @abstractmethod
    def _check_files(self, state: dict[str, Any], version: int, base_model: str) -> None:
        """`AdapterError` unless the files of `version` are intact and fit `base_model`."""

    @abstractmethod
    def _scope(self) -> str:
        """The scope, as error messages name it."""

    @abstractmethod
    def path(self, version: int) -> Path:
        """The directory of `version`'s adapter, its files checked."""

    @abstractmethod
    def add(self, adapter: Path, base_model: str, train: dict[str, Any]) -> AdapterVersion:
        """A new candidate version holding a copy of `adapter` (which must verify)."""

    def versions(self) -> list[AdapterVersion]:
        return [AdapterVersion(**v) for v in self._read()["versions"]]

    def get(self, version: int) -> AdapterVersion:
        for item in self.versions():
            if item.version == version:
                return item
        raise AdapterRegistryError(f"no adapter version {version} in {self._scope()}")

    def serving(self) -> int | None:
        value = self._head()["serving"]
        return int(value) if value is not None else None

    def serving_path(self) -> Path | None:
        """The directory of the serving version's adapter (None: the base model serves)."""
        version = self.serving()
        return None if version is None else self.path(version)

    def record_evaluation(self, version: int, evaluation: dict[str, Any]) -> None:
        with self._locked() as state:
            entry = self._entry(state, version)
            entry["evaluation"] = evaluation

    def canary(self) -> AdapterCanary | None:
        """The canary running, if any."""
        value = self._head()["canary"]
        return AdapterCanary(**value) if value is not None else None

    def pending(self) -> list[int]:
        """Versions waiting for `approve`, oldest first."""
        return list(self._head()["pending"])

    def transitions(self) -> list[dict[str, Any]]:
        """The logged transitions, oldest first: `at` (time.time()), `action`, `version` (a
        label: `v0003` or `base`), `actor`, `reason`, `figures`."""
        return list(self._read()["log"])

    def serving_for(self, key: str) -> int | None:
        """The version the client `key` serves: the canary for its share of keys while one
        runs, else the serving version (None: the base model)."""
        return serving_in(self._head(), key)

    def promote(
        self,
        version: int,
        *,
        margin: float = DEFAULT_MARGIN,
        force: bool = False,
        canary_share: float = 0.0,
        hold: bool = False,
        actor: str = OPERATOR,
    ) -> str:
        """Promote `version`; returns why it was allowed and what it became. Refused (with the
        reason) when it was not evaluated against what serves now or shows no gain, unless
        `force`, and while a canary runs.

        With `hold` it waits for `approve` (`pending`); else with a `canary_share` it becomes
        the canary at that share; else it serves every client from now on."""
        if not 0.0 <= canary_share <= 1.0:
            raise AdapterRegistryError(f"canary share {canary_share} outside [0, 1]")
        with self._locked() as state:
            entry = self._entry(state, version)
            if state["serving"] == version and state["canary"] is None:
                return f"v{version:04d} serves already"  # a replayed promotion changes nothing
            if state["canary"] is not None:
                running = version_label(state["canary"]["version"])
                raise AdapterRegistryError(
                    f"canary {running} is running: wait for its verdict, or roll it back"
                )
            try:
                self._check_files(state, version, entry["base_model"])
            except AdapterError as exc:
                raise AdapterRegistryError(f"refusing a damaged adapter: {exc}") from None
            reason, refusal = "forced", ""
            if not force:
                evaluation = entry.get("evaluation")
                if not evaluation:
                    raise AdapterRegistryError(
                        f"v{version:04d} has not been evaluated; evaluate it or use --force"
                    )
                if evaluation.get("against") != state["serving"]:
                    raise AdapterRegistryError(
                        f"v{version:04d} was evaluated against "
                        f"{_label(evaluation.get('against'))}, but "
                        f"{_label(state['serving'])} serves now: evaluate it again"
                    )
                allowed, reason = promotion_decision(evaluation, margin)
                if not allowed:
                    entry["status"] = "rejected"  # kept on disk when the block ends
                    refusal = f"not promoting v{version:04d}: {reason}"
            if not refusal:
                if hold:
                    if version not in state["pending"]:
                        state["pending"].append(version)
                    entry["status"] = PENDING
                    _log(state, PENDING, version, actor, reason, None)
                    reason += "; waiting for approval"
                elif canary_share > 0.0 and canary_share < 1.0:
                    self._start_canary(state, entry, version, canary_share, actor, reason)
                    reason += f"; canary at {canary_share:.0%} of clients"
                else:
                    self._serve(state, entry, version)
                    _log(state, "promote", version, actor, reason, None)
        if refusal:
            raise AdapterRegistryError(refusal)
        return reason

    def approve(self, version: int, *, canary_share: float = 0.0, actor: str = OPERATOR) -> str:
        """Release a version waiting for approval: into a canary at `canary_share`, or (0)
        straight to serving. Returns what it became (`canary` or `serving`)."""
        with self._locked() as state:
            entry = self._entry(state, version)
            if version not in state["pending"]:
                raise AdapterRegistryError(f"v{version:04d} is not waiting for approval")
            if state["canary"] is not None and 0.0 < canary_share < 1.0:
                running = version_label(state["canary"]["version"])
                raise AdapterRegistryError(f"canary {running} is running: wait for its verdict")
            state["pending"].remove(version)
            _log(state, "approve", version, actor, "approved", None)
            if 0.0 < canary_share < 1.0:
                self._start_canary(state, entry, version, canary_share, actor, "approved")
                return CANARY
            self._end_canary(state, None)
            self._serve(state, entry, version)
            _log(state, "promote", version, actor, "approved", None)
        return "serving"

    def _start_canary(
        self,
        state: dict[str, Any],
        entry: dict[str, Any],
        version: int,
        share: float,
        actor: str,
        reason: str,
    ) -> None:
        previous = state["serving"]
        state["canary"] = {
            "version": version,
            "previous": previous,
            "share": share,
            "started": time.time(),
        }
        entry["status"] = CANARY
        figures = {"share": share, "previous": version_label(previous)}
        _log(state, CANARY, version, actor, reason, figures)

    def _end_canary(self, state: dict[str, Any], status: str | None) -> None:
        canary = state["canary"]
        if canary is None:
            return
        if status is not None:
            self._entry(state, canary["version"])["status"] = status
        state["canary"] = None

    def finish_canary(
        self,
        *,
        promote: bool,
        version: int | None = None,
        actor: str = OPERATOR,
        reason: str = "",
        figures: dict[str, Any] | None = None,
    ) -> int | None:
        """End the running canary: it serves alone (`promote`) or is rolled back; returns the
        version serving now. Refused when no canary runs, or when it is not `version` (the
        canary that was judged) where one is given."""
        with self._locked() as state:
            canary = state["canary"]
            if canary is None:
                raise AdapterRegistryError("no canary is running")
            judged = int(canary["version"])
            if version is not None and judged != version:
                raise AdapterRegistryError(
                    f"the canary running is {version_label(judged)}, not {version_label(version)}"
                )
            entry = self._entry(state, judged)
            if promote:
                self._end_canary(state, None)
                self._serve(state, entry, judged)
                _log(state, "canary-promote", judged, actor, reason, figures)
            else:
                self._end_canary(state, ROLLED_BACK)
                _log(
                    state,
                    "canary-rollback",
                    state["serving"],
                    actor,
                    reason or f"rollback of canary {version_label(judged)}",
                    {**(figures or {}), "of": version_label(judged)},
                )
            serving = state["serving"]
        return int(serving) if serving is not None else None

    def _serve(self, state: dict[str, Any], entry: dict[str, Any], version: int) -> None:
        current = state["serving"]
        if current is not None:
            self._entry(state, current)["status"] = "retired"
        state["history"].append(version)
        state["serving"] = version
        entry["status"] = "serving"

    def rollback(self, *, actor: str = OPERATOR, reason: str = "") -> int | None:
        """Roll back the running canary, else serve the version promoted before the current one
        (None: the base model); returns the version serving now."""
        if self.canary() is not None:
            try:
                return self.finish_canary(promote=False, actor=actor, reason=reason)
            except AdapterRegistryError:
                pass  # ended meanwhile: roll back what serves
        with self._locked() as state:
            history: list[int] = state["history"]
            if not history:
                raise AdapterRegistryError("nothing to roll back: the base model serves")
            current = history.pop()
            self._entry(state, current)["status"] = "retired"
            previous = history[-1] if history else None
            state["serving"] = previous
            if previous is not None:
                self._entry(state, previous)["status"] = "serving"
            _log(
                state,
                "rollback",
                previous,
                actor,
                reason or f"rollback of {version_label(current)}",
                {"of": version_label(current)},
            )
        return previous

    @staticmethod
    def _entry(state: dict[str, Any], version: int) -> dict[str, Any]:
        for entry in state["versions"]:
            if entry["version"] == version:
                assert isinstance(entry, dict)
                return entry
        raise AdapterRegistryError(f"no adapter version {version}")


def serving_in(state: dict[str, Any], key: str) -> int | None:
    """The version the client `key` serves in `state` (`AdapterVersions.serving_for`)."""
    canary = state["canary"]
    if canary is not None and on_canary_arm(key, canary["version"], canary["share"]):
        return int(canary["version"])
    serving = state["serving"]
    return int(serving) if serving is not None else None


class AdapterRegistry(RegistryTransitions):
    """The versions of one scope's adapters, in a JSON file under a file lock in `root`. A
    version's manifest names it `{label}v0003` (what a runner serving it shows in its model id),
    so the versions of a second track (`label` `next-edit-`) are told from the first's."""

    def __init__(self, root: Path, label: str = "") -> None:
        self.root = root
        self.label = label

    @contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        self.root.mkdir(parents=True, exist_ok=True)
        with (self.root / ".lock").open("a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = self._read()
            before = json.dumps(state, sort_keys=True)
            yield state
            if json.dumps(state, sort_keys=True) != before:
                self._write(state)

    def _read(self) -> dict[str, Any]:
        path = self.root / REGISTRY_FILE
        if not path.is_file():
            return empty_state()
        try:
            state = json.loads(path.read_text())
        except ValueError as exc:
            raise AdapterRegistryError(f"{path} is damaged: {exc}") from None
        problem = _state_problem(state)
        if problem:
            raise AdapterRegistryError(f"{path} is not an adapter registry: {problem}")
        state.setdefault("serving", None)
        state.setdefault("history", [])
        state.setdefault("canary", None)
        state.setdefault("pending", [])
        state.setdefault("log", [])
        return state

    def _write(self, state: dict[str, Any]) -> None:
        path = self.root / REGISTRY_FILE
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
        with temporary.open("rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)

    def _scope(self) -> str:
        return str(self.root)

    def _check_files(self, state: dict[str, Any], version: int, base_model: str) -> None:
        verify_adapter(self.root / f"v{version:04d}", base_model)

    def path(self, version: int) -> Path:
        return self.root / self.get(version).name

    def add(self, adapter: Path, base_model: str, train: dict[str, Any]) -> AdapterVersion:
        try:
            verify_adapter(adapter, base_model)
        except AdapterError as exc:
            raise AdapterRegistryError(str(exc)) from None
        with self._locked() as state:
            number = max((v["version"] for v in state["versions"]), default=0) + 1
            record = AdapterVersion(number, time.time(), base_model, "candidate", train)
            target = self.root / record.name
            work = self.root / f".{record.name}.tmp"
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(adapter, work)
            manifest_path = work / "manifest.json"
            manifest = json.loads(manifest_path.read_text())
            manifest["version"] = self.label + record.name
            manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            os.replace(work, target)
            state["versions"].append(asdict(record))
        return record


_VERSION_FIELDS = {f.name for f in fields(AdapterVersion)}
_REQUIRED_FIELDS = {"version", "created", "base_model", "status"}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _state_problem(state: Any) -> str | None:
    """What is wrong with the structure of a registry's state, or None: a file edited by hand
    or written by another program must be refused as damaged, not fail deep inside a reader."""
    if not isinstance(state, dict):
        return "not an object"
    versions = state.get("versions")
    if not isinstance(versions, list):
        return "no list of versions"
    numbers = set()
    for entry in versions:
        if not isinstance(entry, dict):
            return "a version is not an object"
        keys = set(entry)
        if not keys >= _REQUIRED_FIELDS or not keys <= _VERSION_FIELDS:
            return f"a version's fields are {sorted(keys)}"
        if not _is_int(entry["version"]) or not isinstance(entry["base_model"], str):
            return "a version's number or base model has the wrong type"
        if not isinstance(entry["created"], int | float) or not isinstance(entry["status"], str):
            return "a version's time or status has the wrong type"
        if not isinstance(entry.get("train", {}), dict):
            return "a version's training record is not an object"
        if problem := window_problem(entry.get("train", {})):
            return problem
        if not isinstance(entry.get("evaluation"), dict | None):
            return "a version's evaluation is not an object"
        numbers.add(entry["version"])
    serving = state.get("serving")
    if serving is not None and (not _is_int(serving) or serving not in numbers):
        return f"serving names no version: {serving!r}"
    history = state.get("history", [])
    if not isinstance(history, list) or not all(_is_int(v) and v in numbers for v in history):
        return "the history names versions that are not there"
    if problem := _canary_problem(state.get("canary"), numbers):
        return problem
    pending = state.get("pending", [])
    if not isinstance(pending, list) or not all(_is_int(v) and v in numbers for v in pending):
        return "the pending versions are not there"
    log = state.get("log", [])
    if not isinstance(log, list) or not all(isinstance(entry, dict) for entry in log):
        return "the log is not a list of transitions"
    return None


def _log(
    state: dict[str, Any],
    action: str,
    version: int | None,
    actor: str,
    reason: str,
    figures: dict[str, Any] | None,
) -> None:
    log: list[dict[str, Any]] = state["log"]
    log.append(
        {
            "at": time.time(),
            "action": action,
            "version": version_label(version),
            "actor": actor[:64],
            "reason": reason[:512],
            "figures": figures,
        }
    )
    del log[:-MAX_LOG]


def _canary_problem(canary: Any, numbers: set[int]) -> str | None:
    if canary is None:
        return None
    if not isinstance(canary, dict) or set(canary) != {"version", "previous", "share", "started"}:
        return "the canary is not a canary"
    previous = canary["previous"]
    if not _is_int(canary["version"]) or canary["version"] not in numbers:
        return "the canary names no version"
    if previous is not None and (not _is_int(previous) or previous not in numbers):
        return "the canary's previous version is not there"
    share, started = canary["share"], canary["started"]
    if not isinstance(share, int | float) or not 0.0 < share <= 1.0:
        return "the canary's share is not in (0, 1]"
    if not isinstance(started, int | float):
        return "the canary's start is not a time"
    return None


def _label(version: Any) -> str:
    return "the base model" if version is None else f"v{int(version):04d}"
