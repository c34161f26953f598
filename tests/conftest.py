"""Fixtures shared by every test area."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from common.machine import BFLOAT16_VARIABLE
from common.paths import CACHE_DIR_VARIABLE
from tests.support import fixtures

# Training's precision follows the CPU (`common.machine.native_bfloat16`); a test must give the
# same result on any CPU, so tests (and the processes they start) train as on one without
# native bfloat16 unless they say otherwise.
os.environ[BFLOAT16_VARIABLE] = "0"


@pytest.fixture(scope="session")
def _session_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tabloop-cache")


@pytest.fixture(autouse=True)
def _private_cache_dir(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, _session_cache_dir: Path
) -> None:
    """Every test but the slow ones (which load the real models, kept between runs) caches what
    it converts or downloads in one directory of the test session, never the user's: a tiny
    model's converted copies once ended up beside the real ones. Subprocesses inherit it."""
    if request.node.get_closest_marker("slow") is None:
        monkeypatch.setenv(CACHE_DIR_VARIABLE, str(_session_cache_dir))


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    """Directory of the tiny Qwen2-architecture test model, committed under tests/fixtures/."""
    return fixtures.tiny_model_path()


@pytest.fixture(scope="session")
def tiny_embedder_path() -> Path:
    """Directory of the tiny sentence-transformers embedder, committed under tests/fixtures/."""
    return fixtures.tiny_embedder_path()
