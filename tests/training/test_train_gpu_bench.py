"""`bench/train_gpu.py` without a GPU: its arguments, its dry run, and a clear refusal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "train_gpu.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_dry_run_prints_the_bfloat16_settings() -> None:
    done = _run("--dry-run", "--seconds", "30", "--effective-batch", "8", "--corpus", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    settings = report["settings"]
    assert report["dry_run"] is True and report["corpus"].endswith("json")
    assert settings["base_dtype"] == "bfloat16" and settings["autocast"] is True
    assert settings["effective_batch"] == 8 and settings["micro_batch"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--seconds", "0"], "--seconds must be positive", id="no-time"),
        pytest.param(["--micro-batch", "32"], "cannot be larger", id="micro-over-effective"),
        pytest.param(["--corpus", "no-such-package"], "neither a directory", id="corpus"),
    ],
)
def test_bad_arguments_are_refused(args: list[str], message: str) -> None:
    done = _run("--dry-run", *args)
    assert done.returncode != 0
    assert message in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present")
def test_without_a_gpu_it_says_so_and_trains_nothing() -> None:
    done = _run("--seconds", "1")
    assert done.returncode == 2
    assert "no CUDA GPU here" in done.stderr
    assert done.stdout == ""
