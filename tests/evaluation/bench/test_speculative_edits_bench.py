"""`tabloop bench speculative-edits`: the rewrites it samples, the prompt it asks with, and one
run end to end on the tiny model."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from completion.runners.packed import packing_works
from completion.runners.torch_runner import (
    BFLOAT16_EDIT_DRAFT_TOKENS,
    BFLOAT16_PREFILL_CHUNK_TOKENS,
    DEFAULT_EDIT_DRAFT_TOKENS,
)
from evaluation.bench.speculative_edits import main, prompt_for, sample_rewrites


@pytest.mark.parametrize("size", [10, 20, 40])
def test_each_rewrite_changes_one_line_of_its_window(size: int) -> None:
    rewrites = sample_rewrites(size, 6, random.Random(size))
    assert [r.kind for r in rewrites] == ["rename", "change"] * 3
    for rewrite in rewrites:
        assert len(rewrite.original) == len(rewrite.current) == size
        pairs = zip(rewrite.original, rewrite.current, strict=True)
        changed = [i for i, (before, after) in enumerate(pairs) if before != after]
        assert changed == [rewrite.line]
        if rewrite.kind == "rename":
            # The renamed name is still used elsewhere in the window: what the model renames next.
            (new,) = set(re.findall(r"\w+_new\b", rewrite.current[rewrite.line]))
            name = new.removesuffix("_new")
            assert re.search(rf"\b{name}\b", "".join(rewrite.current))


def test_the_prompt_ends_where_the_updated_window_begins() -> None:
    (rewrite,) = sample_rewrites(10, 1, random.Random(1))
    prompt = prompt_for(rewrite)
    current = "".join(rewrite.current)
    assert prompt.endswith(f"{current}<|file_sep|>updated/{rewrite.path}\n")
    assert f"<|file_sep|>original/{rewrite.path}\n{''.join(rewrite.original)}" in prompt
    assert f"<|file_sep|>{rewrite.path}.diff\noriginal:\n{rewrite.original[rewrite.line]}" in prompt


def test_runs_end_to_end(
    tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", str(tiny_model_path), "--engine", "torch", "--n", "2", "--lines", "10"]
    assert main([*argv, "--cache-dir", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["configuration"]["engine"] == "torch"
    assert report["cpu"]["cores"] >= 1  # the CPU the speed-ups are of
    size = report["by_window_lines"]["10"]
    assert size["rewrites"] == 2
    drafted = size["by_draft_tokens"]["16"]
    assert drafted["identical_share"] == 1.0
    # The torch runner checks the first draft in the prompt's last pass: its decode time leaves
    # that out, so only whole requests are compared.
    assert drafted["draft_tokens_in_prompt_pass"] > 0
    assert drafted["decode_speedup_p50"] is None and drafted["decode_tok_s"] is None
    assert drafted["request_speedup_p50"] > 0
    assert report["configuration"]["edit_draft_tokens_max"] == 16


def _against(
    baseline: str, n: int, model: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> Any:
    """The report of the bfloat16 runner against `baseline` on `n` 10-line rewrites."""
    argv = ["--model", str(model), "--engine", "torch-bfloat16", "--n", str(n), "--lines", "10"]
    argv += ["--baseline-engine", baseline, "--threads", "1", "--cache-dir", str(cache), "--json"]
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_a_baseline_engine_runs_the_same_prompts_in_the_same_run(
    tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = _against("torch", 2, tiny_model_path, tmp_path, capsys)
    assert report["configuration"]["compute_type"] == "bfloat16"
    assert report["configuration"]["prefill_chunk_tokens"] == BFLOAT16_PREFILL_CHUNK_TOKENS
    assert report["baseline_engine"]["configuration"]["compute_type"] == "float32"
    ours = report["by_window_lines"]["10"]
    theirs = report["baseline_engine"]["by_window_lines"]["10"]
    drafts, baseline_drafts = str(BFLOAT16_EDIT_DRAFT_TOKENS), str(DEFAULT_EDIT_DRAFT_TOKENS)
    assert list(ours["by_draft_tokens"]) == [drafts]
    assert list(theirs["by_draft_tokens"]) == [baseline_drafts]
    assert ours["prompt_tokens_p50"] == theirs["prompt_tokens_p50"]  # the same prompts
    versus = report["vs_baseline"]["10"]
    assert versus["request_ms_p50"] == ours["by_draft_tokens"][drafts]["request_ms_p50"]
    base = theirs["by_draft_tokens"][baseline_drafts]
    assert versus["request_ms_p50_baseline"] == base["request_ms_p50"]


def test_packed_weights_against_the_same_runner_unpacked(
    tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not packing_works(torch.bfloat16):
        pytest.skip("this CPU's oneDNN does not pack bfloat16 weights")
    report = _against("torch-bfloat16-unpacked", 1, tiny_model_path, tmp_path, capsys)
    assert report["configuration"]["packed_linears"] > 0
    baseline = report["baseline_engine"]["configuration"]
    assert (baseline["compute_type"], baseline["packed_linears"]) == ("bfloat16", 0)
    assert "10" in report["vs_baseline"]


def test_the_same_engine_as_its_own_baseline_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="same engine"):
        main(["--engine", "torch", "--baseline-engine", "torch", "--cache-dir", str(tmp_path)])
