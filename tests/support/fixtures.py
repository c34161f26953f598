"""The models the tests run on, committed as data under `tests/fixtures/`.

A model trained or initialised at test time comes out different on different CPUs (floating-point
kernels, instruction sets, thread counts), and a test that depends on what it says then tests
the machine. So the tiny completion model (`tests.support.tiny_model`) and the tiny embedder
(`tests.support.embedders`) are built once by their builders and committed, each directory with
a `SHA256SUMS` file that `tests/test_fixtures.py` checks.

To rebuild them (after changing a builder, with its version bumped):

    .venv/bin/python -m tests.support.fixtures rebuild

then commit `tests/fixtures/` and say in the commit why the fixtures changed.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import tempfile
from pathlib import Path

from tests.support import tiny_model

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT / "tests" / "fixtures"
TINY_MODEL = FIXTURES / f"tiny-model-v{tiny_model.BUILDER_VERSION}"
TINY_EMBEDDER_VERSION = 1
TINY_EMBEDDER = FIXTURES / f"tiny-embedder-v{TINY_EMBEDDER_VERSION}"
CHECKSUMS = "SHA256SUMS"
REBUILD = ".venv/bin/python -m tests.support.fixtures rebuild"


def file_checksums(directory: Path) -> dict[str, str]:
    """SHA-256 of every file under `directory` but the checksum file, by relative POSIX path."""
    sums: dict[str, str] = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and path.name != CHECKSUMS:
            relative = path.relative_to(directory).as_posix()
            sums[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
    return sums


def recorded_checksums(directory: Path) -> dict[str, str]:
    """The checksums recorded in `directory/SHA256SUMS` (`sha256sum`'s format)."""
    sums: dict[str, str] = {}
    for line in (directory / CHECKSUMS).read_text(encoding="utf-8").splitlines():
        digest, name = line.split(maxsplit=1)
        sums[name.lstrip("*")] = digest
    return sums


def write_checksums(directory: Path) -> None:
    lines = [f"{digest}  {name}\n" for name, digest in file_checksums(directory).items()]
    (directory / CHECKSUMS).write_text("".join(lines), encoding="utf-8")


def _require(directory: Path) -> Path:
    if not (directory / CHECKSUMS).is_file():
        raise FileNotFoundError(f"test fixture {directory} is missing; rebuild it with `{REBUILD}`")
    return directory


def tiny_model_path() -> Path:
    """The committed tiny Qwen2-architecture completion model."""
    return _require(TINY_MODEL)


def tiny_embedder_path() -> Path:
    """The committed tiny sentence-transformers embedder."""
    return _require(TINY_EMBEDDER)


def rebuild(fixtures: Path = FIXTURES) -> list[Path]:
    """Build both models from scratch into `fixtures`, each with its checksums."""
    from tests.support.embedders import build_tiny_sentence_transformer

    fixtures.mkdir(parents=True, exist_ok=True)
    built: list[Path] = []
    with tempfile.TemporaryDirectory(dir=fixtures, prefix=".rebuild-") as staging:
        builders = {
            TINY_MODEL.name: tiny_model.build_tiny_model,
            TINY_EMBEDDER.name: build_tiny_sentence_transformer,
        }
        for name, build in builders.items():
            work = build(Path(staging) / name)
            write_checksums(work)
            target = fixtures / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.move(str(work), str(target))
            built.append(target)
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["rebuild"])
    parser.parse_args(argv)
    for path in rebuild():
        print(f"{path.relative_to(REPO_ROOT)}: {len(file_checksums(path))} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
