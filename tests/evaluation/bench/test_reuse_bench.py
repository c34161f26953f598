"""`tabloop bench reuse` on the tiny model: the kept first part serves, the text is the request's
own, and the engine holds one part at a time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.bench import reuse


def test_the_bench_serves_first_parts_and_resets_between_prompts(
    tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--model", str(tiny_model_path), "--cache-dir", str(tmp_path), "--prompts", "3",
        "--new-tokens", "4", "--json",
    ]  # fmt: skip
    assert reuse.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["prompts"] == 3 and report["prompts_split"] == 3
    assert all(row["kept_tokens"] > 0 for row in report["rows"])
    # Served from the kept state or read after another prompt: the same request, the same text.
    assert report["identical_to_first_request"] == 1.0
    assert report["cache_resets"] == 2  # one part kept at a time
    assert report["ttft_speedup_p50"] is not None
