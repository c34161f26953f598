"""A workspace's run: warm start from the serving adapter, and the training window of its own
feedback, through `tabloop train model`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file

from completion.adapters import MANIFEST, WEIGHTS
from training.budget import Budget
from training.feedback import FEEDBACK_FILE, Feedback, FeedbackStore
from training.lora import LoraShape
from training.registry import AdapterRegistry, scope_dir
from training.trainer import TrainSettings
from training.workspace import WarmStart, load_trainable, train_workspace

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = TrainSettings(
    micro_batch=2, effective_batch=4, max_prompt_tokens=96, lora=LoraShape(rank=4, alpha=8)
)


def _serving_adapter(workspace: Path, model: Path, cache: Path) -> AdapterRegistry:
    """A registry whose v0001, trained a few steps (its LoRA B is no longer zero), serves."""
    result, _ = train_workspace(
        workspace,
        model=str(model),
        cache_dir=cache,
        work_dir=cache / "run",
        budget=Budget(samples=8),
        settings=SETTINGS,
    )
    assert result.warm_start == WarmStart(None, "no adapter registry").summary()
    registry = AdapterRegistry(scope_dir(cache, workspace=workspace))
    adapter = Path(result.adapter)
    manifest = json.loads((adapter / MANIFEST).read_text())
    registry.add(adapter, manifest["base_model"], {})
    registry.promote(1, force=True)
    return registry


def _lora_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable weights under the names peft saves them by (without the adapter name)."""
    return {
        name.replace(".default.", "."): p.detach().clone()
        for name, p in model.named_parameters()
        if p.requires_grad
    }


def test_a_new_version_starts_from_the_serving_adapters_weights(
    workspace: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    registry = _serving_adapter(workspace, tiny_model_path, tmp_path)
    saved = load_file(str(registry.path(1) / WEIGHTS))
    assert any(t.abs().max() > 0 for name, t in saved.items() if "lora_B" in name)
    warm = load_trainable(str(tiny_model_path), tmp_path, SETTINGS, (1, registry.path(1)))
    assert warm.warm_start.summary() == {
        "from": "v0001",
        "fresh": False,
        "reason": "the serving adapter fits this run",
    }
    weights = _lora_weights(warm.model)
    assert weights.keys() == saved.keys()
    for name, tensor in saved.items():
        assert torch.equal(weights[name], tensor), name
    fresh = _lora_weights(load_trainable(str(tiny_model_path), tmp_path, SETTINGS).model)
    assert all(not t.any() for name, t in fresh.items() if "lora_B" in name)  # peft's start


def test_a_run_with_another_dropout_continues_from_the_serving_adapter_with_its_own(
    workspace: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    registry = _serving_adapter(workspace, tiny_model_path, tmp_path)
    saved = load_file(str(registry.path(1) / WEIGHTS))
    dropped = replace(SETTINGS, lora=replace(SETTINGS.lora, dropout=0.25))
    warm = load_trainable(str(tiny_model_path), tmp_path, dropped, (1, registry.path(1)))
    assert warm.warm_start.version == 1
    weights = _lora_weights(warm.model)
    assert all(torch.equal(weights[name], tensor) for name, tensor in saved.items())
    assert warm.model.peft_config["default"].lora_dropout == 0.25
    rates = {m.p for name, m in warm.model.named_modules() if name.endswith("lora_dropout.default")}
    assert rates == {0.25}


def test_an_adapter_that_does_not_fit_is_not_warm_started_from(
    workspace: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    registry = _serving_adapter(workspace, tiny_model_path, tmp_path)
    other_rank = replace(SETTINGS, lora=LoraShape(rank=8, alpha=16))
    fresh = load_trainable(str(tiny_model_path), tmp_path, other_rank, (1, registry.path(1)))
    assert fresh.warm_start.version is None
    assert "v0001 does not fit: its LoRA shape differs: r 4 (this run: 8)" in (
        fresh.warm_start.reason
    )
    assert all(not t.any() for name, t in _lora_weights(fresh.model).items() if "lora_B" in name)
    manifest_path = registry.path(1) / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "base_model": "another-model@1"}))
    other_base = load_trainable(str(tiny_model_path), tmp_path, SETTINGS, (1, registry.path(1)))
    assert other_base.warm_start.version is None
    assert "trained on another-model@1" in other_base.warm_start.reason


def _run(command: list[str], cache: Path) -> dict[str, object]:
    environ = {**os.environ, "TABLOOP_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report: dict[str, object] = json.loads(done.stdout)
    return report


def _feedback(cache: Path, workspace: Path, count: int, name: str) -> None:
    store = FeedbackStore(cache / FEEDBACK_FILE, workspace=workspace)
    for i in range(count):
        store.record(Feedback(f"{name}{i}.py", f"x = {i}\n", f"f({i})", "\n", "accepted", 1.0, 0.5))
    store.close()


def test_train_model_trains_on_its_workspace_since_the_serving_mark(
    workspace: Path, tiny_model_path: Path, tmp_path: Path
) -> None:
    """The first version trains on this workspace's feedback only (another workspace's and
    rows from before workspaces are not read), holding out the newest; the second starts from
    the first's weights and trains on what came after its mark, with older rows replayed."""
    cache = tmp_path / "cache"
    other = tmp_path / "other"
    other.mkdir()
    _feedback(cache, workspace, 10, "mine")
    _feedback(cache, other, 7, "theirs")
    command = [
        sys.executable, "-m", "tabloop", "train", "model",
        "--workspace", str(workspace), "--model", str(tiny_model_path),
        "--samples", "8", "--micro-batch", "2", "--effective-batch", "4",
        "--max-prompt-tokens", "96", "--rank", "4", "--eval-n", "0", "--json",
    ]  # fmt: skip
    first = _run(command, cache)
    assert first["version"] == "v0001"
    window = first["window"]
    assert isinstance(window, dict)
    assert (window["new"], window["held_out"], window["replayed"]) == (8, 2, 0)
    assert window["since"] is None
    assert first["warm_start"] == {
        "from": None,
        "fresh": True,
        "reason": "no adapter serves: the base model",
    }
    registry = AdapterRegistry(scope_dir(cache, workspace=workspace))
    recorded = registry.get(1).train["window"]
    assert recorded == window and recorded["trained_through"][1] == 8  # the 8th row of `mine`
    registry.promote(1, force=True)

    _feedback(cache, workspace, 6, "later")
    second = _run(command, cache)
    window = second["window"]
    assert isinstance(window, dict)
    # After v0001's mark: its 2 held-out rows and 6 new ones; the newest 1 is held out.
    assert (window["new"], window["held_out"], window["older"]) == (7, 1, 8)
    assert window["replayed"] == 2  # a quarter of 9 examples an epoch
    assert window["since"] == recorded["trained_through"]
    assert second["warm_start"] == {
        "from": "v0001",
        "fresh": False,
        "reason": "the serving adapter fits this run",
    }
