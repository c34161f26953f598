"""The recorded client capability profiles: well formed, and still what the clients send."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.protocol import default_converter

from tests.editors.conftest import PROFILES, REPO

NEOVIM_PROFILE = "neovim-0.12.json"
PROFILE_FILES = [NEOVIM_PROFILE, "vscode.json"]


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


def recapture_command(nvim: str) -> str:
    """The command that re-records the Neovim profile (tests/profiles/README.md), from the repo."""
    return (
        f"cd {REPO} && {nvim} --headless --clean -l tests/profiles/capture/neovim.lua "
        f"{sys.executable} tests/profiles/{NEOVIM_PROFILE}"
    )


def test_neovim_profile_matches_a_fresh_capture(nvim: str, tmp_path: Path) -> None:
    """Fails (never skips) when this Neovim is not the one recorded: the profile must follow it."""
    out = tmp_path / "profile.json"
    script = PROFILES / "capture" / "neovim.lua"
    subprocess.run(
        [nvim, "--headless", "--clean", "-l", str(script), sys.executable, str(out)],
        check=True,
        timeout=60,
        capture_output=True,
    )
    fresh = json.loads(out.read_text(encoding="utf-8"))
    recorded = json.loads((PROFILES / NEOVIM_PROFILE).read_text(encoding="utf-8"))
    rerecord = (
        f"Re-record the profile with this Neovim:\n    {recapture_command(nvim)}\n"
        "then review the diff, update the Neovim row of tests/profiles/README.md and commit both."
    )
    assert fresh["clientInfo"] == recorded["clientInfo"], (
        f"tests/profiles/{NEOVIM_PROFILE} was recorded with {recorded['clientInfo']}, "
        f"but this is {fresh['clientInfo']} ({nvim}). {rerecord}"
    )
    assert fresh["capabilities"] == recorded["capabilities"], (
        f"{fresh['clientInfo']} sends other capabilities than tests/profiles/{NEOVIM_PROFILE} "
        f"holds. {rerecord}"
    )
