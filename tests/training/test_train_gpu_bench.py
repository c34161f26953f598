"""`bench/train_gpu.py` without a GPU: its arguments, its dry run, a clear refusal, and its run
on the CPU with the tiny model."""

from __future__ import annotations

import importlib.util
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


def test_the_same_run_on_the_cpu_trains_registers_and_serves_a_version(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    # Everything the GPU run does but CUDA's counters: the bfloat16 settings, the trainer, the
    # registry's add and promotion, the report.
    spec = importlib.util.spec_from_file_location("train_gpu", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for n in range(6):
        body = "\n".join(f"    total += value * {k} + {n}" for k in range(12))
        source = f"def f{n}(value):\n    total = 0\n{body}\n    return total\n"
        (corpus / f"m{n}.py").write_text(source)
    args = script.parse_args(
        [
            "--model", str(tiny_model_path), "--cache-dir", str(tmp_path / "cache"),
            "--corpus", str(corpus), "--samples", "4", "--effective-batch", "2",
            "--max-prompt-tokens", "96",
        ]
    )  # fmt: skip
    report = script.train(args, device="cpu")
    assert report["device"] == "cpu" and report["gpu"] is None
    assert report["samples"] == 4 and report["steps"] == 2
    assert report["served_version"] == 1
    assert report["mixed_precision"] == "bf16"
    assert report["settings"]["base_dtype"] == "bfloat16"
    assert report["samples_per_s"] > 0 and report["time_to_servable_s"] >= report["train_s"]
