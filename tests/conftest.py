"""Fixtures shared by every test area."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import fixtures


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    """Directory of the tiny Qwen2-architecture test model, committed under tests/fixtures/."""
    return fixtures.tiny_model_path()


@pytest.fixture(scope="session")
def tiny_embedder_path() -> Path:
    """Directory of the tiny sentence-transformers embedder, committed under tests/fixtures/."""
    return fixtures.tiny_embedder_path()
