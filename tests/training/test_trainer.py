from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from itertools import islice
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from completion.adapters import WEIGHTS
from training.budget import Budget, parse_duration
from training.examples import FimExample
from training.memory import size_micro_batch
from training.trainer import (
    CHECKPOINTS,
    KILL_AT_STEP_ENV,
    TrainResult,
    TrainSettings,
    mixed_stream,
)
from training.workspace import train_workspace

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("20m", 1200, id="minutes"),
        pytest.param("1h30m", 5400, id="hours-minutes"),
        pytest.param("90s", 90, id="seconds"),
        pytest.param("45", 45, id="bare"),
        pytest.param("0.5h", 1800, id="fraction"),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "20x", "-5m", "0s", "5s20m"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_budget_needs_a_limit_and_ends_at_the_first() -> None:
    with pytest.raises(ValueError):
        Budget()
    budget = Budget(samples=100, seconds=60)
    assert not budget.reached(99, 0, 59)
    assert budget.reached(100, 0, 1) and budget.reached(1, 0, 60)
    assert budget.fraction(50, 0, 45) == 0.75


@pytest.mark.parametrize(
    ("free", "per_example", "expected"),
    [
        pytest.param(10**12, 1, 8, id="plenty"),
        pytest.param(3 * 4 * 100, 100, 4, id="four-fit"),
        pytest.param(3 * 3 * 100, 100, 2, id="three-fit-two-divides"),
        pytest.param(10, 100, 1, id="none-fit-still-one"),
    ],
)
def test_micro_batch_divides_the_effective_batch(
    free: int, per_example: int, expected: int
) -> None:
    assert size_micro_batch(8, "cuda", free, per_example) == expected
    # On a CPU one example a pass, however much memory is free.
    assert size_micro_batch(8, "cpu", free, per_example) == 1


def _ex(name: str) -> FimExample:
    return FimExample(name, "", "x", "", "line")


def test_mixed_stream_interleaves_and_goes_on_when_one_side_ends() -> None:
    code = iter([_ex(f"c{i}") for i in range(6)])
    notes = iter([_ex(f"f{i}") for i in range(2)])
    order = [e.path for e in mixed_stream(code, notes, 0.5)]
    assert order == ["c0", "f0", "c1", "f1", "c2", "c3", "c4", "c5"]
    only_code = [e.path for e in islice(mixed_stream(iter([_ex("c")]), None, 0.5), 5)]
    assert only_code == ["c"]


def _tensors(adapter: Path) -> dict[str, torch.Tensor]:
    return load_file(str(adapter / WEIGHTS))


def _train_command(workspace: Path, model: Path, samples: int) -> list[str]:
    return [
        sys.executable, "-m", "tabloop", "train", "model",
        "--workspace", str(workspace), "--model", str(model),
        "--samples", str(samples), "--micro-batch", "2", "--effective-batch", "4",
        "--checkpoint-every", "2", "--max-prompt-tokens", "96", "--rank", "4",
        "--eval-n", "0", "--json",
    ]  # fmt: skip


def _run(command: list[str], cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "TABLOOP_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True)


def test_sigkill_and_resume_gives_the_same_adapter(
    workspace: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    command = _train_command(workspace, tiny_model_path, samples=24)
    straight = _run(command, tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr
    straight_report = json.loads(straight.stdout)

    killed = _run(command, tmp_path / "killed", **{KILL_AT_STEP_ENV: "5"})
    assert killed.returncode == -signal.SIGKILL
    runs = list((tmp_path / "killed").glob(f"adapters/*/runs/current/{CHECKPOINTS}/step-*"))
    assert sorted(p.name for p in runs) == ["step-00000002", "step-00000004"]
    resumed = _run(command, tmp_path / "killed")
    assert resumed.returncode == 0, resumed.stderr
    resumed_report = json.loads(resumed.stdout)
    assert resumed_report["training"]["resumed_from_step"] == 4
    assert resumed_report["training"]["steps"] == straight_report["training"]["steps"] == 6

    a = _tensors(next((tmp_path / "straight").glob("adapters/*/v0001")))
    b = _tensors(next((tmp_path / "killed").glob("adapters/*/v0001")))
    assert a.keys() == b.keys() and a
    assert any(t.abs().max() > 0 for name, t in a.items() if "lora_B" in name)  # it trained
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=0, atol=1e-5), name


SMALL = TrainSettings(micro_batch=2, effective_batch=4, checkpoint_every=1, max_prompt_tokens=96)


def _train(
    workspace: Path,
    model: Path,
    cache: Path,
    work: Path,
    samples: int,
    settings: TrainSettings = SMALL,
) -> TrainResult:
    result, _ = train_workspace(
        workspace,
        model=str(model),
        cache_dir=cache,
        work_dir=work,
        budget=Budget(samples=samples),
        settings=settings,
    )
    return result


def test_corrupt_checkpoint_is_refused_and_the_previous_one_used(
    workspace: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    work = tmp_path / "run"
    _train(workspace, tiny_model_path, tmp_path, work, samples=8)  # checkpoints at steps 1, 2
    newest = next((work / CHECKPOINTS / "step-00000002").glob("*.distcp"))
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    result = _train(workspace, tiny_model_path, tmp_path, work, samples=12)
    assert result.resumed_from_step == 1
    assert "does not match its checksum" in result.refused_checkpoints[0]


def test_a_checkpoint_resumes_with_another_micro_batch_but_not_another_effective_batch(
    workspace: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    """The micro-batch only decides how a step is computed (it may differ on other hardware),
    so a checkpoint resumes with another; the effective batch decides the maths: refused."""
    work = tmp_path / "run"
    _train(workspace, tiny_model_path, tmp_path, work, samples=4)
    other_micro = replace(SMALL, micro_batch=1)
    resumed = _train(workspace, tiny_model_path, tmp_path, work, 8, other_micro)
    assert resumed.resumed_from_step == 1 and resumed.steps == 2
    assert resumed.micro_batch == 1 and resumed.accumulation == 4
    other = replace(SMALL, effective_batch=2)
    refused = _train(workspace, tiny_model_path, tmp_path, work, 4, other)
    assert refused.resumed_from_step == 0
    assert "other settings" in refused.refused_checkpoints[0]


def test_a_run_resumes_across_activation_checkpointing_but_not_across_the_math(
    workspace: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    """Activation checkpointing recomputes the same values, so a checkpoint made with it resumes
    without it; the base model's dtype, autocast, the head's positions and the KL anchor change
    what is computed, so a checkpoint made with other values of them is refused."""
    work = tmp_path / "run"
    checkpointed = replace(SMALL, checkpointing=True)
    first = _train(workspace, tiny_model_path, tmp_path, work, 4, checkpointed)
    assert first.settings is not None and first.settings["checkpointing"] is True
    assert first.settings["middle_only"] is True
    resumed = _train(
        workspace, tiny_model_path, tmp_path, work, 8, replace(SMALL, checkpointing=False)
    )
    assert resumed.resumed_from_step == 1 and resumed.steps == 2
    for change in (
        {"base_dtype": "bfloat16"},
        {"autocast": True},
        {"middle_only": False},
        {"kl_weight": 0.1},
    ):
        settings = replace(SMALL, **change)
        other = _train(workspace, tiny_model_path, tmp_path, work, 4, settings)
        assert other.resumed_from_step == 0, change  # refused: it starts over
        assert other.refused_checkpoints, change
        assert all("other settings" in r for r in other.refused_checkpoints), change
