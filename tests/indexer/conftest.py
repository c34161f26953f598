"""Fixtures of the index tests: real code copied from the standard library, small embedders."""

from __future__ import annotations

import shutil
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from indexer.pipeline import IndexStats
from indexer.service import WorkspaceIndex
from indexer.settings import IndexSettings
from tests.support.embedders import HashingEmbedder
from tests.support.fixtures import tiny_embedder_path

STDLIB = Path(sysconfig.get_paths()["stdlib"])
REPO_ROOT = Path(__file__).resolve().parents[2]

# Small, self-contained modules with clear docstrings: quick to embed, easy to ask about.
SEARCH_MODULES = (
    "json",
    "textwrap.py",
    "heapq.py",
    "bisect.py",
    "fnmatch.py",
    "shlex.py",
    "base64.py",
    "colorsys.py",
    "glob.py",
)
PLUMBING_MODULES = ("json", "bisect.py", "colorsys.py", "fnmatch.py")


def copy_stdlib(target: Path, names: tuple[str, ...]) -> Path:
    """Copy stdlib modules (files or packages, without caches) into `target`."""
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        source = STDLIB / name
        if source.is_dir():
            shutil.copytree(
                source, target / name, ignore=shutil.ignore_patterns("__pycache__", "tests")
            )
        else:
            shutil.copy(source, target / name)
    return target


@pytest.fixture(scope="session")
def stdlib_search_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A read-only workspace of real stdlib modules for search-quality tests."""
    return copy_stdlib(tmp_path_factory.mktemp("stdlib-search"), SEARCH_MODULES)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A fresh, writable copy of a few stdlib modules."""
    return copy_stdlib(tmp_path / "ws", PLUMBING_MODULES)


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    path = tmp_path / "cache"
    path.mkdir()
    return path


@pytest.fixture
def embedder() -> HashingEmbedder:
    return HashingEmbedder()


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """A one-layer random BERT in sentence-transformers format (committed test data)."""
    return tiny_embedder_path()


def quiet_settings(**overrides: Any) -> IndexSettings:
    """Settings for tests: no watcher, no periodic rescans, unless asked for."""
    values: dict[str, Any] = {"watch": False, "rescan_interval_s": 0.0, **overrides}
    return IndexSettings(**values)


def index_once(
    root: Path, cache_dir: Path, embedder: HashingEmbedder, **overrides: Any
) -> tuple[dict[str, Any], IndexStats | None]:
    """Index `root` to completion and close it: (final status, stats of the pass)."""
    settings = quiet_settings(**overrides)
    with WorkspaceIndex(root, settings, cache_dir, embedder=embedder) as index:
        index.start()
        assert index.wait_idle(600), index.status()
        return index.status(), index.last_stats


@pytest.fixture
def open_index(
    cache_dir: Path, embedder: HashingEmbedder
) -> Iterator[Callable[..., WorkspaceIndex]]:
    """`open_index(root, **settings)`: a started index, closed after the test."""
    opened: list[WorkspaceIndex] = []

    def factory(root: Path, **overrides: Any) -> WorkspaceIndex:
        index = WorkspaceIndex(root, quiet_settings(**overrides), cache_dir, embedder=embedder)
        index.start()
        assert index.wait_idle(600), index.status()
        opened.append(index)
        return index

    yield factory
    for index in opened:
        index.close()
