"""Versions of the adapters of one scope (a workspace, or a tenant of the backend) on disk.

The same discipline as the policy registry: every trained adapter becomes a numbered version;
a version is evaluated on held-out files before it may serve; it is promoted only when it beats
the version serving now (the base model when none) by a margin with a confidence bound, unless
forced; every promotion is remembered, so `rollback` puts the previous one back. Versions are
never deleted. The state is one JSON file, replaced atomically under a file lock.

    <root>/registry.json        {"versions": [...], "serving": 3, "history": [1, 3]}
    <root>/v0003/               the adapter (completion.adapters format)
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from completion.adapters import AdapterError, verify_adapter
from training.window import window_problem

REGISTRY_FILE = "registry.json"
RUN_DIR = "runs/current"
"""Where the run in progress keeps its checkpoints, under a registry's root (`tabloop train model`
and the backend's tenant runs): a run started again there resumes."""
DEFAULT_MARGIN = 0.005


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
    """Whether an evaluation shows a gain: the 95% lower bound of the paired edit-similarity
    difference above `margin`, and exact-line match not lower."""
    similarity = evaluation.get("edit_similarity_difference", {})
    exact = evaluation.get("exact_line_difference", {})
    low = float(similarity.get("ci95_low", float("-inf")))
    if low <= margin:
        return False, f"edit similarity gain's 95% lower bound {low:+.4f} is not above {margin}"
    if float(exact.get("mean", -1.0)) < 0:
        return False, f"exact-line match is lower ({float(exact['mean']):+.4f})"
    return True, f"edit similarity gain's 95% lower bound {low:+.4f} > {margin}"


class AdapterRegistry:
    """The versions of one scope's adapters."""

    def __init__(self, root: Path) -> None:
        self.root = root

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
            return {"versions": [], "serving": None, "history": []}
        try:
            state = json.loads(path.read_text())
        except ValueError as exc:
            raise AdapterRegistryError(f"{path} is damaged: {exc}") from None
        problem = _state_problem(state)
        if problem:
            raise AdapterRegistryError(f"{path} is not an adapter registry: {problem}")
        state.setdefault("serving", None)
        state.setdefault("history", [])
        return state

    def _write(self, state: dict[str, Any]) -> None:
        path = self.root / REGISTRY_FILE
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
        with temporary.open("rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)

    def versions(self) -> list[AdapterVersion]:
        return [AdapterVersion(**v) for v in self._read()["versions"]]

    def get(self, version: int) -> AdapterVersion:
        for item in self.versions():
            if item.version == version:
                return item
        raise AdapterRegistryError(f"no adapter version {version} in {self.root}")

    def path(self, version: int) -> Path:
        return self.root / self.get(version).name

    def serving(self) -> int | None:
        value = self._read()["serving"]
        return int(value) if value is not None else None

    def serving_path(self) -> Path | None:
        """The directory of the serving version's adapter (None: the base model serves)."""
        version = self.serving()
        return None if version is None else self.path(version)

    def add(self, adapter: Path, base_model: str, train: dict[str, Any]) -> AdapterVersion:
        """A new candidate version holding a copy of `adapter` (which must verify)."""
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
            manifest["version"] = record.name
            manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
            os.replace(work, target)
            state["versions"].append(asdict(record))
        return record

    def record_evaluation(self, version: int, evaluation: dict[str, Any]) -> None:
        with self._locked() as state:
            entry = self._entry(state, version)
            entry["evaluation"] = evaluation

    def promote(self, version: int, *, margin: float = DEFAULT_MARGIN, force: bool = False) -> str:
        """Serve `version` from now on; returns why it was allowed. Refused (with the reason)
        when it was not evaluated against what serves now or shows no gain, unless `force`."""
        with self._locked() as state:
            entry = self._entry(state, version)
            try:
                verify_adapter(self.root / f"v{version:04d}", entry["base_model"])
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
                self._serve(state, entry, version)
        if refusal:
            raise AdapterRegistryError(refusal)
        return reason

    def _serve(self, state: dict[str, Any], entry: dict[str, Any], version: int) -> None:
        current = state["serving"]
        if current is not None:
            self._entry(state, current)["status"] = "retired"
        state["history"].append(version)
        state["serving"] = version
        entry["status"] = "serving"

    def rollback(self) -> int | None:
        """Serve the version promoted before the current one (None: the base model)."""
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
        return previous

    @staticmethod
    def _entry(state: dict[str, Any], version: int) -> dict[str, Any]:
        for entry in state["versions"]:
            if entry["version"] == version:
                assert isinstance(entry, dict)
                return entry
        raise AdapterRegistryError(f"no adapter version {version}")


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
    return None


def _label(version: Any) -> str:
    return "the base model" if version is None else f"v{int(version):04d}"
