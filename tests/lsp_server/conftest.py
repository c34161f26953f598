"""Fixtures for the server's tests: isolated config and cache, client capability profiles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.protocol import default_converter

PROFILES_DIR = Path(__file__).parents[1] / "profiles"
PROFILES = {"vscode": "vscode.json", "neovim-0.12": "neovim-0.12.json"}


def load_profile(name: str) -> types.InitializeParams:
    """A recorded client's `initialize` params (capabilities and clientInfo)."""
    data = json.loads((PROFILES_DIR / PROFILES[name]).read_text(encoding="utf-8"))
    params: types.InitializeParams = default_converter().structure(data, types.InitializeParams)
    return params


@pytest.fixture(autouse=True)
def isolated_user_config(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No test reads the developer's own config.toml."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))
