"""trl's KTOTrainer on accepted and rejected suggestions, on the tiny model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from safetensors.torch import load_file

from completion.adapters import WEIGHTS, read_manifest
from completion.fim import template_for
from training.budget import Budget
from training.examples import FimExample
from training.feedback import FEEDBACK_FILE, Feedback, FeedbackStore
from training.kto import kto_rows, train_kto
from training.lora import LoraShape
from training.trainer import TrainSettings
from training.workspace import load_trainable, train_workspace

SETTINGS = TrainSettings(base_dtype="float32", lora=LoraShape(rank=4, alpha=8))


def _feedback(middle: str, advantage: float) -> FimExample:
    return FimExample(
        "m.py", "def area(r):\n    return ", middle, "\n", "line", advantage, 1.0, "feedback"
    )


EXAMPLES = [
    _feedback("3.14159 * r * r", 1.0),
    _feedback("r", -0.5),
    _feedback("math.pi * r ** 2", 0.8),
    _feedback("None", -0.5),
    _feedback("r * r", 0.0),  # no label: left out
    FimExample("c.py", "x = ", "1", "\n", "line"),  # code: left out
]


def test_rows_label_accepted_and_rejected_suggestions(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    trainable = load_trainable(str(tiny_model_path), tmp_path, SETTINGS)
    tokenizer, template = trainable.tokenizer, template_for(trainable.family)
    rows = kto_rows(EXAMPLES, tokenizer, template, SETTINGS, limit=10)
    assert [r["label"] for r in rows] == [True, False, True, False]
    assert rows[0]["completion"] == "3.14159 * r * r" + tokenizer.eos_token
    prompt = template.build("def area(r):\n    return ", "\n", (), "m.py")
    assert rows[0]["prompt"] == tokenizer.decode(tokenizer(prompt)["input_ids"])
    assert len(kto_rows(EXAMPLES, tokenizer, template, SETTINGS, limit=3)) == 3


def test_kto_trains_the_lora_weights_against_the_base_model(
    tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trainable = load_trainable(str(tiny_model_path), tmp_path, SETTINGS)
    template = template_for(trainable.family)
    rows = kto_rows(EXAMPLES, trainable.tokenizer, template, SETTINGS, limit=10)
    result = train_kto(
        trainable.model, trainable.tokenizer, trainable.base_model_id, rows, tmp_path / "run",
        seed=0, learning_rate=1e-2, batch=2, max_length=128,
    )  # fmt: skip
    assert (result.samples, result.desirable, result.undesirable) == (4, 2, 2)
    assert result.steps == 2
    # Nothing on stdout, where `tabloop train model --json` writes its report.
    assert capsys.readouterr().out == ""
    adapter = Path(result.adapter)
    assert read_manifest(adapter)["base_model"] == trainable.base_model_id
    weights = load_file(str(adapter / WEIGHTS))
    assert any(t.abs().max() > 0 for name, t in weights.items() if "lora_B" in name)


def test_kto_needs_both_labels_and_a_batch_of_two(tiny_model_path: Path, tmp_path: Path) -> None:
    trainable = load_trainable(str(tiny_model_path), tmp_path, SETTINGS)
    template = template_for(trainable.family)
    positive = [e for e in EXAMPLES if e.advantage > 0]
    accepted = kto_rows(positive, trainable.tokenizer, template, SETTINGS, 10)
    with pytest.raises(ValueError, match="both accepted and rejected"):
        train_kto(
            trainable.model, trainable.tokenizer, "m", accepted, tmp_path,
            seed=0, learning_rate=1e-3, batch=2, max_length=64,
        )  # fmt: skip
    rows = kto_rows(EXAMPLES, trainable.tokenizer, template, SETTINGS, 10)
    with pytest.raises(ValueError, match="batch of at least 2"):
        train_kto(
            trainable.model, trainable.tokenizer, "m", rows, tmp_path,
            seed=0, learning_rate=1e-3, batch=1, max_length=64,
        )  # fmt: skip


def test_a_workspace_run_with_the_kto_objective_trains_on_its_window(
    workspace: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    store = FeedbackStore(tmp_path / FEEDBACK_FILE, workspace=workspace)
    for i in range(10):
        outcome, reward = ("accepted", 1.0) if i % 2 else ("ignored", -0.25)
        store.record(Feedback(f"m{i}.py", f"x = {i}\n", f"f({i})", "\n", outcome, reward, 0.5))
    settings = replace(SETTINGS, objective="kto", effective_batch=2, max_prompt_tokens=64)
    result, _held_out = train_workspace(
        workspace, model=str(tiny_model_path), cache_dir=tmp_path, work_dir=tmp_path / "run",
        budget=Budget(samples=4), settings=settings, feedback=store, code=False,
    )  # fmt: skip
    assert result.samples == 4 and result.steps == 2
    assert result.settings is not None and result.settings["objective"] == "kto"
    assert result.window is not None and result.window["new"] == 8  # two of ten held out
    assert (Path(result.adapter) / WEIGHTS).is_file()
    with pytest.raises(ValueError, match="objective"):
        TrainSettings(objective="dpo")  # type: ignore[arg-type]


def test_a_tenant_run_refuses_the_kto_objective(capsys: pytest.CaptureFixture[str]) -> None:
    from tabloop.model_cli import train_model_main

    with pytest.raises(SystemExit) as exit_info:
        train_model_main(["--tenant", "acme", "--objective", "kto", "--samples", "4"])
    assert exit_info.value.code == 2
    assert "--objective kto trains a workspace's adapter" in capsys.readouterr().err
