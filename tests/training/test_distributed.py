"""The trainer on accelerate under a real launcher (torchrun) with 2 processes on the CPU
(gloo): they agree with each other and with one process; a run killed on 2 processes
resumes on 1 with another micro-batch and sees every example exactly once; an out-of-memory
error halves the micro-batch and keeps the effective batch and the examples, also when it comes
in the last micro-batch of a step, after gradients were accumulated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from completion.adapters import WEIGHTS
from training.budget import Budget
from training.examples import split_files, stream_code_examples, workspace_files
from training.launch import launch_command, settings_json
from training.lora import LoraShape
from training.trainer import (
    CHECKPOINTS,
    EXAMPLES_LOG_ENV,
    KILL_AT_STEP_ENV,
    OUT_OF_MEMORY_AT_ENV,
    TrainResult,
    TrainSettings,
)
from training.workspace import load_trainable

ROOT = Path(__file__).resolve().parents[2]
# No LoRA dropout: with it each process draws its own masks, and runs on different numbers of
# processes differ by more than the order of a sum.
SETTINGS = TrainSettings(
    effective_batch=4,
    micro_batch=1,
    checkpoint_every=1,
    max_prompt_tokens=96,
    lora=LoraShape(rank=4, alpha=8, dropout=0.0),
)
SAMPLES = 16  # 4 steps of 4
TOLERANCE = 1e-6
"""Largest difference of a LoRA weight between runs on 1 and 2 processes: only the order of the
sums differs (measured: 7e-9 after 4 steps, on weights of about 2e-4)."""


def _arguments(
    workspace: Path, model: Path, cache: Path, work: Path, settings: TrainSettings
) -> list[str]:
    return [
        "--workspace", str(workspace), "--model", str(model), "--cache-dir", str(cache),
        "--work-dir", str(work), "--samples", str(SAMPLES), "--device", "cpu",
        "--settings", settings_json(settings), "--reports", str(work.parent / "reports"),
    ]  # fmt: skip


def _run(command: list[str], log: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        EXAMPLES_LOG_ENV: str(log),
        **env,
    }
    return subprocess.run(
        command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=300
    )


def _one_process(arguments: list[str]) -> list[str]:
    return [sys.executable, "-m", "training.launch", *arguments]


def _tensors(work: Path) -> dict[str, torch.Tensor]:
    return load_file(str(work / "adapter" / WEIGHTS))


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and a
    assert any(t.abs().max() > 0 for name, t in a.items() if "lora_B" in name)  # it trained
    for name in a:
        assert torch.allclose(a[name], b[name], rtol=0, atol=TOLERANCE), name


def _entries(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _positions(entries: list[dict[str, object]]) -> list[int]:
    return sorted(p for e in entries for p in e["positions"])  # type: ignore[attr-defined]


def test_two_processes_agree_with_each_other_and_with_one(
    workspace: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    two = tmp_path / "two" / "run"
    args = _arguments(workspace, tiny_model_path, tmp_path / "cache", two, SETTINGS)
    launched = _run(launch_command(2, args), tmp_path / "two.log")
    assert launched.returncode == 0, launched.stderr[-3000:]
    report = json.loads(launched.stdout.strip().splitlines()[-1])
    assert report["processes"] == 2 and report["steps"] == 4 and report["samples"] == SAMPLES
    ranks = [
        json.loads((tmp_path / "two" / "reports" / f"rank-{r}.json").read_text()) for r in (0, 1)
    ]
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]  # DDP kept them equal
    assert ranks[0]["loss"] == ranks[1]["loss"] and ranks[0]["tokens"] == ranks[1]["tokens"]
    # Each process trained on its half of every step, the halves together the whole stream.
    entries = _entries(tmp_path / "two.log")
    assert {e["rank"] for e in entries} == {0, 1}
    assert all(len(e["positions"]) == 2 for e in entries)  # type: ignore[arg-type]
    assert _positions(entries) == list(range(SAMPLES))

    one = tmp_path / "one" / "run"
    single = replace(SETTINGS, micro_batch=4)  # the same effective batch in one pass
    args = _arguments(workspace, tiny_model_path, tmp_path / "cache", one, single)
    alone = _run(_one_process(args), tmp_path / "one.log")
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert json.loads(alone.stdout)["processes"] == 1
    assert _positions(_entries(tmp_path / "one.log")) == list(range(SAMPLES))
    _assert_close(_tensors(two), _tensors(one))


def test_killed_on_two_processes_resumes_on_one_with_another_micro_batch(
    workspace: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    work = tmp_path / "killed" / "run"
    log = tmp_path / "killed.log"
    args = _arguments(workspace, tiny_model_path, tmp_path / "cache", work, SETTINGS)
    killed = _run(launch_command(2, args), log, **{KILL_AT_STEP_ENV: "3"})
    assert killed.returncode != 0
    checkpoints = sorted(p.name for p in (work / CHECKPOINTS).glob("step-*"))
    assert checkpoints == ["step-00000001", "step-00000002"]
    manifest = json.loads((work / CHECKPOINTS / "step-00000002" / "manifest.json").read_text())
    assert manifest["processes"] == 2 and manifest["position"] == 8

    later_log = tmp_path / "resumed.log"
    resumed = _run(_one_process(args), later_log, **{KILL_AT_STEP_ENV: ""})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    report = json.loads(resumed.stdout)
    assert report["resumed_from_step"] == 2 and report["steps"] == 4
    assert report["processes"] == 1 and report["micro_batch"] == 1
    # What the adapter learned from: the killed run's steps up to its checkpoint, then the
    # resumed run's; each example of the stream exactly once.
    kept = [e for e in _entries(log) if int(e["step"]) <= 2]  # type: ignore[call-overload]
    later = _entries(later_log)
    assert {e["rank"] for e in kept} == {0, 1} and {e["rank"] for e in later} == {0}
    assert [e["step"] for e in later] == [3, 4]
    assert all(e["micro_batch"] == 1 for e in later)
    assert _positions(kept + later) == list(range(SAMPLES))

    straight = tmp_path / "straight" / "run"
    args = _arguments(workspace, tiny_model_path, tmp_path / "cache", straight, SETTINGS)
    assert _run(_one_process(args), tmp_path / "straight.log").returncode == 0
    _assert_close(_tensors(work), _tensors(straight))


class _OutOfMemoryAbove:
    """Fault injection: the device runs out of memory on a micro-batch larger than `limit`."""

    def __init__(self, limit: int, error: Exception) -> None:
        self.limit = limit
        self.error = error
        self.raised = 0

    def __call__(self, size: int) -> None:
        if size > self.limit:
            self.raised += 1
            raise self.error


class _OutOfMemoryOnCall:
    """Fault injection: the device runs out of memory once, on the `call`-th micro-batch."""

    def __init__(self, call: int, error: Exception) -> None:
        self.call = call
        self.error = error
        self.calls = 0
        self.raised = 0

    def __call__(self, size: int) -> None:
        self.calls += 1
        if self.calls == self.call:
            self.raised += 1
            raise self.error


def _with_and_without(
    inject: _OutOfMemoryAbove | _OutOfMemoryOnCall,
    settings: TrainSettings,
    workspace: Path,
    model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[TrainResult, TrainResult]:
    """The same run from the same weights with the fault injected, and without it."""
    train_files, _ = split_files(workspace_files(workspace, ()))
    trainable = load_trainable(str(model), tmp_path / "cache", settings)
    start = {n: p.detach().clone() for n, p in trainable.model.named_parameters()}
    results = []
    for name, fault in (("oom", inject), ("plain", None)):
        with torch.no_grad():  # both runs from the same weights
            for n, p in trainable.model.named_parameters():
                p.copy_(start[n])
        trainer = trainable.trainer(settings, tmp_path / name, "cpu")
        trainer.before_micro_batch = fault
        monkeypatch.setenv(EXAMPLES_LOG_ENV, str(tmp_path / f"{name}.log"))
        results.append(
            trainer.run(
                lambda: stream_code_examples(workspace, train_files, settings.seed),
                Budget(samples=SAMPLES),
            )
        )
    return results[0], results[1]


OUT_OF_MEMORY = [
    pytest.param(
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8GB"),
        id="cpu-allocator",
    ),
    pytest.param(
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        id="cuda",
    ),
]


@pytest.mark.parametrize("error", OUT_OF_MEMORY)
def test_out_of_memory_halves_the_micro_batch_and_keeps_the_effective_batch(
    workspace: Path,
    tiny_model_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    error: Exception,
) -> None:
    injected = _OutOfMemoryAbove(1, error)
    settings = replace(SETTINGS, micro_batch=4)
    oom, plain = _with_and_without(
        injected, settings, workspace, tiny_model_path, tmp_path, monkeypatch
    )
    assert injected.raised == 2  # at 4, then at 2; one example a pass fits
    assert (oom.micro_batch, oom.accumulation) == (1, 4)
    assert (plain.micro_batch, plain.accumulation) == (4, 1)
    assert oom.steps == plain.steps == 4 and oom.samples == plain.samples == SAMPLES
    entries = _entries(tmp_path / "oom.log")
    assert [len(e["positions"]) for e in entries] == [4, 4, 4, 4]  # type: ignore[arg-type]
    assert [e["micro_batch"] for e in entries] == [1, 1, 1, 1]
    assert _positions(entries) == list(range(SAMPLES))
    _assert_close(_tensors(tmp_path / "oom"), _tensors(tmp_path / "plain"))


@pytest.mark.parametrize("error", OUT_OF_MEMORY[:1])
def test_out_of_memory_in_a_steps_last_micro_batch_discards_its_gradients(
    workspace: Path,
    tiny_model_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    error: Exception,
) -> None:
    # Two micro-batches of 2 a step; the second of the third step (the one whose backward pass
    # syncs) runs out of memory after the first has accumulated its gradients: the retry must
    # start the step from no gradients, or those examples would count twice.
    injected = _OutOfMemoryOnCall(6, error)
    settings = replace(SETTINGS, micro_batch=2)
    oom, plain = _with_and_without(
        injected, settings, workspace, tiny_model_path, tmp_path, monkeypatch
    )
    assert injected.raised == 1
    assert (oom.micro_batch, oom.accumulation) == (1, 4)
    assert (plain.micro_batch, plain.accumulation) == (2, 2)
    assert oom.steps == plain.steps == 4 and oom.samples == plain.samples == SAMPLES
    entries = _entries(tmp_path / "oom.log")
    assert [e["micro_batch"] for e in entries] == [2, 2, 1, 1]
    assert _positions(entries) == list(range(SAMPLES))
    _assert_close(_tensors(tmp_path / "oom"), _tensors(tmp_path / "plain"))


def test_out_of_memory_on_one_of_two_processes_halves_both(
    workspace: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    # Each process's share of a step is one micro-batch of 2. Process 1 runs out of memory on
    # its third, the one whose backward pass DDP would sync: process 0 must not wait for it in
    # an all-reduce, and both must go on at one example a pass with the same effective batch.
    settings = replace(SETTINGS, micro_batch=2)
    work = tmp_path / "oom" / "run"
    args = _arguments(workspace, tiny_model_path, tmp_path / "cache", work, settings)
    launched = _run(launch_command(2, args), tmp_path / "oom.log", **{OUT_OF_MEMORY_AT_ENV: "1:3"})
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert "injected (1:3)" not in launched.stdout
    ranks = [
        json.loads((tmp_path / "oom" / "reports" / f"rank-{r}.json").read_text()) for r in (0, 1)
    ]
    assert [(r["micro_batch"], r["accumulation"]) for r in ranks] == [(1, 2), (1, 2)]
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]
    entries = _entries(tmp_path / "oom.log")
    assert [e["micro_batch"] for e in entries if e["rank"] == 1] == [2, 2, 1, 1]
    assert _positions(entries) == list(range(SAMPLES))

    plain = tmp_path / "plain" / "run"
    args = _arguments(workspace, tiny_model_path, tmp_path / "cache", plain, settings)
    assert _run(launch_command(2, args), tmp_path / "plain.log").returncode == 0
    _assert_close(_tensors(work), _tensors(plain))
