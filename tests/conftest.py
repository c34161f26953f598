"""Fixtures shared by every test area."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.tiny_model import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    """Directory of the tiny Qwen2-architecture test model (built once, then cached)."""
    return build_tiny_model()
