"""A small real workspace for the training tests: the standard library's `json` package, plus
files the index denies (a secret by name, a secret by content, an ignored file)."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

import pytest


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    shutil.copytree(Path(sysconfig.get_paths()["stdlib"]) / "json", root / "json")
    shutil.rmtree(root / "json" / "__pycache__", ignore_errors=True)
    (root / ".gitignore").write_text("generated.py\n")
    (root / "generated.py").write_text("def generated_function(argument):\n    return 1\n" * 20)
    (root / ".env").write_text("API_KEY=abcdef\n")
    (root / "settings.py").write_text(
        'AWS_SECRET = "'
        + "AKIA"
        + 'Q3EGRT7K2LMN5PXZ"\n'
        + "def configure(value):\n    return value\n" * 10
    )
    return root
