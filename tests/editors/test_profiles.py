"""The recorded client capability profiles: well formed, and still what the clients send."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.protocol import default_converter

from tests.editors.conftest import PROFILES

PROFILE_FILES = ["neovim-0.12.json", "vscode.json"]


@pytest.mark.parametrize("name", PROFILE_FILES)
def test_profile_parses_and_offers_inline_completion(name: str) -> None:
    raw = json.loads((PROFILES / name).read_text(encoding="utf-8"))
    assert set(raw) == {"clientInfo", "capabilities"}
    params = default_converter().structure(raw, types.InitializeParams)
    caps = params.capabilities
    assert caps.text_document is not None
    assert caps.text_document.inline_completion is not None
    assert caps.text_document.completion is not None
    assert caps.workspace is not None and caps.workspace.configuration is True
    assert caps.window is not None and caps.window.work_done_progress is True


def test_neovim_profile_matches_a_fresh_capture(nvim: str, tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    script = PROFILES / "capture" / "neovim.lua"
    subprocess.run(
        [nvim, "--headless", "--clean", "-l", str(script), sys.executable, str(out)],
        check=True,
        timeout=60,
        capture_output=True,
    )
    fresh = json.loads(out.read_text(encoding="utf-8"))
    recorded = json.loads((PROFILES / "neovim-0.12.json").read_text(encoding="utf-8"))
    if fresh["clientInfo"] != recorded["clientInfo"]:
        pytest.skip(f"a different Neovim ({fresh['clientInfo']}) than the one recorded")
    assert fresh["capabilities"] == recorded["capabilities"]
