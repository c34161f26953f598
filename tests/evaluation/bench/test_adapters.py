"""`tabloop bench adapters` end to end on the tiny model: train, serve the adapter, compare."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.bench import adapters


@pytest.mark.parametrize("engine", ["ctranslate2", "torch"])
def test_the_bench_trains_serves_and_compares_on_the_same_holes(
    engine: str, tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--corpora", "json", "--model", str(tiny_model_path), "--budget", "2s", "--n", "4",
        "--effective-batch", "2", "--context-tokens", "96", "--max-new-tokens", "6",
        "--engine", engine, "--cache-dir", str(tmp_path / "cache"), "--json",
    ]  # fmt: skip
    assert adapters.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["settings"]["engine"] == engine
    (corpus,) = report["corpora"]
    assert corpus["corpus"].endswith("json") and corpus["held_out_files"]
    assert corpus["training"]["samples"] >= 2 and corpus["training"]["steps"] >= 1
    serving = corpus["serving"]
    assert serving["engine"] == engine and serving["adapter_ready_s"] > 0
    # The adapter's version is in the id of the model that completed the adapted holes.
    assert "+" in serving["model_id"].split("@", 1)[1]
    if engine == "ctranslate2":
        assert serving["model_id"].endswith("+ct2-int8")
    assert corpus["base"]["n"] == corpus["adapted"]["n"] == 4
    difference = corpus["exact_line_match_paired_difference"]
    assert difference["ci95_low"] <= difference["mean"] <= difference["ci95_high"]


def test_the_cost_only_run_still_serves_the_adapter(
    tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--corpora", "json", "--model", str(tiny_model_path), "--budget", "1s", "--n", "0",
        "--effective-batch", "2", "--context-tokens", "96", "--cache-dir", str(tmp_path), "--json",
    ]  # fmt: skip
    assert adapters.main(argv) == 0
    (corpus,) = json.loads(capsys.readouterr().out)["corpora"]
    assert corpus["serving"]["adapter_ready_s"] > 0 and "base" not in corpus
