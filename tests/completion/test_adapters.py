"""Serving base + adapter in the local runner, swapping without a restart, refusing bad ones."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from completion.adapters import CONFIG, MANIFEST, AdapterError, save_adapter
from completion.runners.loading import load_model
from completion.runners.torch_runner import TorchRunner
from completion.types import CancelToken
from tests.support import adapters as damage


def _never(text: str) -> int | None:
    return None


@pytest.fixture(scope="module")
def runner(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> TorchRunner:
    return TorchRunner(str(tiny_model_path), tmp_path_factory.mktemp("cache"), threads=1)


@pytest.fixture(scope="module")
def adapter(runner: TorchRunner, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An adapter whose LoRA B weights are non-zero, so it changes what the model computes."""
    from training.lora import LoraShape, attach_lora

    _tokenizer, model = load_model(runner.source, "float32", Path(runner.source.location))
    wrapped = attach_lora(model, LoraShape(rank=2, alpha=4, dropout=0.0))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    target = tmp_path_factory.mktemp("adapters") / "good"
    save_adapter(wrapped, target, runner.base_model_id, {"version": "v0007"})
    return target


def _logits(runner: TorchRunner) -> torch.Tensor:
    ids = runner.tokenizer("def add(a, b):\n    return", return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        return runner.model(input_ids=ids).logits[0, -1].clone()


def _generate(runner: TorchRunner) -> str:
    return runner.generate(
        "def add(a, b):\n    return", max_new_tokens=6, stop=_never, cancel=CancelToken()
    ).text


def test_swap_serves_the_adapter_and_back(runner: TorchRunner, adapter: Path) -> None:
    base_logits, base_text = _logits(runner), _generate(runner)
    runner.swap_adapter(adapter)
    assert runner.adapter == adapter
    assert runner.model_id == f"{runner.base_model_id}+v0007"
    assert not torch.allclose(_logits(runner), base_logits)
    _generate(runner)  # decodes with the adapter (what it says is not asserted)
    runner.swap_adapter(None)
    assert runner.model_id == runner.base_model_id
    assert torch.equal(_logits(runner), base_logits)
    assert _generate(runner) == base_text


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        pytest.param(damage.flip_byte, "checksum", id="flipped-byte"),
        pytest.param(lambda d: (d / CONFIG).unlink(), "missing", id="no-config"),
        pytest.param(lambda d: (d / MANIFEST).unlink(), "manifest", id="no-manifest"),
        pytest.param(damage.wrong_shape, "shape", id="wrong-shape"),
        pytest.param(damage.other_base, "trained on", id="other-base-model"),
    ],
)
def test_a_bad_adapter_is_refused_and_the_serving_one_keeps_serving(
    runner: TorchRunner, adapter: Path, tmp_path: Path, damage: object, message: str
) -> None:
    runner.swap_adapter(adapter)
    serving_logits = _logits(runner)
    bad = tmp_path / "bad"
    shutil.copytree(adapter, bad)
    damage(bad)  # type: ignore[operator]
    with pytest.raises(AdapterError, match=message):
        runner.swap_adapter(bad)
    assert runner.adapter == adapter
    assert runner.model_id.endswith("+v0007")
    assert torch.equal(_logits(runner), serving_logits)
    runner.swap_adapter(None)
