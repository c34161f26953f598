"""`tabloop bench embedding` on the committed tiny model: both layouts built, run and compared."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.bench import embedding


def test_both_layouts_are_built_run_and_compared(
    tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", str(tiny_model_path), "--prompts", "3", "--checkpoints", "2"]
    assert (
        embedding.main([*argv, "--new-tokens", "4", "--threads", "1", "--cache-dir", str(tmp_path)])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["command"].startswith("tabloop bench embedding --model")
    sizes = report["weights_file_mb"]
    assert sizes["int8_table"] < sizes["float32_table"]  # the table's float32 bytes are gone
    for name in ("float32_table", "int8_table"):
        after = report["resident"][name]["after_prompts"]
        assert set(after) == {"2", "3"}  # each checkpoint, and the end
        assert after["3"]["rss_mb"] > 0 and after["3"]["weights_file_mb"] > 0
    assert set(report["rss_saved_mb"]) == {"2", "3"}
    identical, _, total = report["greedy_outputs_identical"].partition(" of ")
    assert total == "3" and 0 <= int(identical) <= 3
    assert not any(tmp_path.glob("bench-embedding-*"))  # the copies are removed
