"""`tabloop bench train` end to end on the tiny model: each configuration in its own process, on
the same examples, against the trainer as first built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.bench import train


def test_each_configuration_trains_in_its_own_process_on_the_same_examples(
    tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--model", str(tiny_model_path), "--configs", "default,default@2", "--samples", "4",
        "--effective-batch", "2", "--max-prompt-tokens", "64", "--corpus", "json",
        "--threads", "1", "--cache-dir", str(tmp_path), "--json",
    ]  # fmt: skip
    assert train.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["baseline"] == "today" and report["command"].startswith("tabloop bench train")
    assert report["cpu"]["cores"] >= 1 and "flags" in report["cpu"]
    results = report["results"]
    assert list(results) == ["today", "default", "default@2"]
    for name, result in results.items():
        assert "error" not in result, result
        assert result["config"] == name and result["samples"] == 4 and result["steps"] == 2
        assert result["samples_per_s"] > 0 and result["peak_rss_mb"] > 0
        # The training's peak alone (reset after loading) is never above the whole process's
        # (VmHWM and getrusage may round a page apart).
        assert 0 < result["peak_rss_training_mb"] <= result["peak_rss_mb"] + 1
        assert 0 < result["peak_rss_loading_mb"] <= result["peak_rss_mb"] + 1
    # The same examples: the same token count in every configuration.
    assert len({r["tokens"] for r in results.values()}) == 1
    today, default = results["today"]["settings"], results["default"]["settings"]
    assert (today["base_dtype"], today["autocast"], today["middle_only"]) == (
        "float32",
        False,
        False,
    )
    assert today["checkpointing"] is False and today["lora"]["dropout"] == 0.05
    assert default["middle_only"] is True and default["checkpointing"] is True
    assert default["lora"]["dropout"] == 0.0
    # The trainer bounds oneDNN's primitive cache; the trainer as first built had oneDNN's own.
    assert results["default"]["onednn_primitive_cache_capacity"] == "64"
    assert results["today"]["onednn_primitive_cache_capacity"] == "1024"
    assert report["ratio_to_baseline"]["today"]["samples_per_s"] == 1.0
    # Two processes under torchrun: the main process's report, every process's memory, the
    # same examples (the token count) and the same settings.
    assert [results[n]["processes"] for n in results] == [1, 1, 2]
    two = results["default@2"]
    assert two["settings"] == results["default"]["settings"]
    assert len(two["peak_rss_mb_per_process"]) == 2
    assert two["peak_rss_mb"] == pytest.approx(sum(two["peak_rss_mb_per_process"]), abs=0.2)


def test_an_unknown_configuration_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="unknown configuration 'fast'"):
        train.main(["--configs", "fast", "--cache-dir", str(tmp_path)])
