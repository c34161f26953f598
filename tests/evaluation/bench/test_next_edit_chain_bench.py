"""`tabloop bench next-edit-chain` end to end: two real servers over stdio on a scripted model
served over loopback HTTP, driven through a small repository's history. The model carries a
rename on one use at a time, so each accepted prediction leads to another."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.bench.next_edit_chain import main, offset_at, position_at
from tests.support.completion_server import serve_completions
from tests.support.git_repo import make_repo
from tests.support.scripted_model import ScriptedModel

SEP = "<|file_sep|>"
FILLER = "".join(f"value_{n} = {n}\n" for n in range(30))
BEFORE = "def scale(width, factor):\n    wide = width * factor\n    return wide + width\n"
RENAMED = BEFORE.replace("scale(width,", "scale(w,")
STEP1 = RENAMED.replace("wide = width", "wide = w")
STEP2 = STEP1.replace("wide + width", "wide + w")


def window_rule(window: str) -> str:
    """The end of a prompt whose current window is `window` (the whole file: its 40 lines on
    each side take it all in)."""
    return f"{SEP}current/m.py\n{window}{SEP}updated/m.py\n"


def test_offsets_and_positions_count_utf16_columns() -> None:
    text = "a😀b\nxy"
    assert offset_at(text, 0, 3) == 2  # the emoji is two UTF-16 units
    assert offset_at(text, 1, 1) == 5 and offset_at(text, 5, 0) == len(text)
    assert position_at(text, 2) == (0, 3) and position_at(text, 5) == (1, 1)


def test_a_chain_after_an_accepted_edit_is_answered_ahead_only_with_prefetch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The rename on line 0 is one hunk, and a change far below (past the window) another: the
    # point after the first has the rename in its history and the cursor on line 0.
    ids = make_repo(
        tmp_path / "repo",
        [
            {"m.py": BEFORE + FILLER},
            {"m.py": RENAMED + FILLER.replace("value_29 = 29", "value_29 = 30")},
        ],
    )
    model = ScriptedModel(
        rules={
            window_rule(RENAMED + FILLER): STEP1 + FILLER + SEP,
            window_rule(STEP1 + FILLER): STEP2 + FILLER + SEP,
        },
        default=SEP,  # anywhere else: no change
    )
    with serve_completions(model) as (url, _):
        options = {
            "completion": {
                "runner": "http",
                "httpUrl": url,
                "httpModel": "scripted",
                "fimTemplate": "qwen",
            },
            # The scripted model's pieces outnumber the HTTP runner's token estimate: a margin.
            "nextEdit": {
                "windowLines": 40,
                "windowTokens": 400,
                "marginTokens": 512,
                "screenBelow": 0,
            },
        }
        argv = ["--repo", str(tmp_path / "repo"), "--commits", f"{ids[0]}..{ids[1]}"]
        argv += ["--points", "10", "--read-ms", "200", "--debounce-ms", "50", "--pause-s", "1.05"]
        argv += ["--cache-dir", str(tmp_path / "cache"), "--options", json.dumps(options)]
        argv += ["--inline-after-tab-ms", "20"]  # as Neovim asks, sooner
        assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["points"] == 2  # after each of the two hunks
    assert report["settings"]["options"] == options
    assert report["settings"]["after_tab_ms"] == 0.0  # asked at once after Tab, as the clients do
    prefetch, baseline = report["prefetch"], report["baseline"]
    for server in (prefetch, baseline):
        assert server["points"] == 2
        assert server["edits_shown"] == server["chains"] == 1  # at the rename's point
        assert server["chained_outcomes"] == {"shown": 1}  # STEP1 -> STEP2
        # The inline request after Tab was answered (empty: the model writes nothing there).
        assert server["inline_after_tab_shown"] == 0
        assert server["inline_after_tab_ms"]["p50"] is not None
        # Each point ended with the server idle (its model thread has no job).
        assert server["idle_wait_ms"]["not_idle"] == 0 and server["idle_wait_ms"]["p50"] is not None
    assert (prefetch["chained_reused"], prefetch["chained_model_calls"]) == (1, 0)
    assert (baseline["chained_reused"], baseline["chained_model_calls"]) == (0, 1)
    assert prefetch["prefetch"]["prefetchUsed"] == 1
    assert baseline["prefetch"] == {"prefetchStarted": 0, "prefetchUsed": 0, "prefetchCancelled": 0}
    assert report["chains_both"] == {"points": 1, "identical_answers": 1}
    assert report["cpu"]["cores"] >= 1
    for server in (prefetch, baseline):
        # Both first requests went to the model; one showed the rename's next use. The HTTP
        # runner keeps no prompts, so nothing was read ahead.
        assert server["first_model_calls"] == 2
        assert server["first_shown_request_ms"]["p50"] is not None
        assert server["first_prompt_tokens"]["cached_share"] == 0.0
        assert server["preread"]["started"] == 0


def test_the_first_requests_read_less_of_their_prompts_with_preread(
    tmp_path: Path, tiny_model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the tiny model (torch, which keeps prompts), three hunks far apart: the server that
    reads ahead computes less of the prompt at the point after the third."""
    spread = "".join(f"value_{n} = {n}\n" for n in range(60))
    ids = make_repo(
        tmp_path / "repo",
        [
            {"m.py": spread},
            {
                "m.py": spread.replace("value_0 = 0", "value_0 = 1")
                .replace("value_20 = 20", "value_20 = 21")
                .replace("value_40 = 40", "value_40 = 41")
            },
        ],
    )
    options = {
        "completion": {"model": str(tiny_model_path), "engine": "torch"},
        "nextEdit": {"engine": "completion", "screenBelow": 0},
    }
    argv = ["--repo", str(tmp_path / "repo"), "--commits", f"{ids[0]}..{ids[1]}"]
    argv += ["--points", "10", "--read-ms", "0", "--debounce-ms", "50", "--vary", "preread"]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--options", json.dumps(options)]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["settings"]["servers"].endswith("nextEdit.preread on / off")
    preread, baseline = report["preread"], report["baseline"]
    assert preread["points"] == baseline["points"] == 3  # after each hunk
    assert preread["preread"]["tokens"] > 0 and baseline["preread"]["started"] == 0
    # Both keep what an earlier prompt started with (the history is the workspace's, oldest
    # first); the reads ahead add the starts no prompt had before.
    shares = [s["first_prompt_tokens"]["cached_share"] for s in (preread, baseline)]
    assert shares[0] > shares[1], shares
    assert preread["first_model_calls"] == baseline["first_model_calls"] == 3
