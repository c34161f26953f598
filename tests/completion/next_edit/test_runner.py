"""Which runner rewrites next edits, and the torch bfloat16 one: merged adapters, following."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from common.machine import BFLOAT16_VARIABLE
from completion.adapters import AdapterError
from completion.next_edit import NextEditSettings
from completion.next_edit.runner import (
    _native_here,
    follow_adapter,
    load_next_edit_runner,
    next_edit_engine,
)
from completion.runners.loading import load_model
from completion.runners.packed import PackedLinear, packing_works
from completion.runners.torch_runner import (
    BFLOAT16_EDIT_DRAFT_TOKENS,
    BFLOAT16_PREFILL_CHUNK_TOKENS,
    TorchRunner,
)
from completion.settings import CompletionSettings
from completion.types import CancelToken
from tests.support import adapters as damage
from tests.support.adapters import strong_adapter

AMX = ["avx512f", "avx512_bf16", "amx_bf16", "amx_int8"]
AVX512_BF16 = ["avx2", "avx512f", "avx512_vnni", "avx512_bf16"]  # AMD EPYC (Zen 4), no AMX
NO_BF16 = ["avx2", "fma", "avx512f", "avx512_vnni"]  # 8-bit dot products, no bfloat16 ones


@pytest.mark.parametrize(
    ("engine", "completion", "flags", "expected"),
    [
        ("auto", {}, AMX, "torch-bfloat16"),
        ("auto", {"engine": "ctranslate2"}, AMX, "torch-bfloat16"),
        ("auto", {}, AVX512_BF16, "torch-bfloat16"),
        ("auto", {}, NO_BF16, "completion"),
        ("auto", {}, ["avx2", "fma"], "completion"),
        ("auto", {"engine": "torch"}, AMX, "completion"),
        ("auto", {"runner": "http"}, AMX, "completion"),
        ("completion", {}, AMX, "completion"),
        ("torch-bfloat16", {}, NO_BF16, "torch-bfloat16"),
    ],
)
def test_auto_takes_torch_bfloat16_beside_a_fast_engine_where_bfloat16_is_native(
    engine: str, completion: dict[str, Any], flags: list[str], expected: str
) -> None:
    settings = NextEditSettings.model_validate({"engine": engine})
    found = next_edit_engine(settings, CompletionSettings.model_validate(completion), flags)
    assert found == expected


def test_auto_on_this_cpu_follows_the_native_bfloat16_override(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The tests run with `$TABLOOP_NATIVE_BFLOAT16` at 0, so they pick the same runner on any
    CPU; a user can force either answer the same way."""
    settings, completion = NextEditSettings(), CompletionSettings()
    for forced, expected in (("1", "torch-bfloat16"), ("0", "completion")):
        monkeypatch.setenv(BFLOAT16_VARIABLE, forced)
        _native_here.cache_clear()
        assert next_edit_engine(settings, completion) == expected
    _native_here.cache_clear()


def test_an_unknown_engine_is_refused() -> None:
    with pytest.raises(ValueError, match="engine"):
        NextEditSettings.model_validate({"engine": "bfloat16"})


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def adapter(tiny_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An adapter whose LoRA B weights are non-zero, so it changes what the model computes."""
    runner = TorchRunner(str(tiny_model_path), tmp_path_factory.mktemp("ref"), threads=1)
    target = tmp_path_factory.mktemp("adapters") / "good"
    source, location = runner.source, Path(runner.source.location)
    return strong_adapter(source, runner.base_model_id, location, target, {"version": "v0003"})


def _runner(tiny_model_path: Path, cache_dir: Path, adapter: Path | None = None) -> TorchRunner:
    settings = CompletionSettings(
        model=str(tiny_model_path), engine="torch", adapter=str(adapter or ""), threads=1
    )
    return load_next_edit_runner(settings, cache_dir)


def _weight(runner: TorchRunner, name: str) -> torch.Tensor:
    """The weight of module `name`, packed (`completion.runners.packed`) or not."""
    module = runner.model.get_submodule(name)
    weight = module.dense_weight() if isinstance(module, PackedLinear) else module.weight
    return weight.detach().float().clone()


def _q_proj(runner: TorchRunner) -> str:
    return next(n for n, _ in runner.model.named_modules() if n.endswith("q_proj"))


def test_the_runner_is_torch_bfloat16_with_its_own_prefill_and_draft_sizes(
    tiny_model_path: Path, cache_dir: Path
) -> None:
    runner = _runner(tiny_model_path, cache_dir)
    assert runner.dtype == "bfloat16"
    assert {p.dtype for p in runner.model.parameters()} == {torch.bfloat16}
    assert runner.prefill_chunk_tokens == BFLOAT16_PREFILL_CHUNK_TOKENS
    assert runner.edit_draft_tokens == BFLOAT16_EDIT_DRAFT_TOKENS
    float32 = TorchRunner(str(tiny_model_path), cache_dir, threads=1)
    assert (float32.prefill_chunk_tokens, float32.edit_draft_tokens) == (64, 16)
    assert float32.packed_linears == 0


def test_the_bfloat16_runner_packs_its_projections_and_computes_what_the_plain_model_does(
    tiny_model_path: Path, cache_dir: Path
) -> None:
    if not packing_works(torch.bfloat16):
        pytest.skip("this CPU's oneDNN does not pack bfloat16 weights")
    runner = _runner(tiny_model_path, cache_dir)
    layers = runner.model.model.layers
    assert runner.packed_linears == 7 * len(layers)  # q, k, v, o, gate, up, down
    assert all(isinstance(layer.mlp.down_proj, PackedLinear) for layer in layers)
    assert type(runner.model.lm_head) is torch.nn.Linear  # the tiny model's is the embeddings'
    _, plain = load_model(runner.source, "bfloat16", cache_dir)
    ids = torch.tensor([runner.tokenizer.encode("def add(a, b):\n    return a + b\n")])
    with torch.inference_mode():
        packed_logits = runner.model(input_ids=ids).logits.float()
        plain_logits = plain(input_ids=ids).logits.float()
    scale = float(plain_logits.abs().max())
    assert torch.allclose(packed_logits, plain_logits, atol=2e-2 * scale)


def test_an_adapter_is_merged_into_the_bfloat16_weights_and_taken_out_again(
    tiny_model_path: Path, cache_dir: Path, adapter: Path
) -> None:
    from safetensors.torch import load_file

    runner = _runner(tiny_model_path, cache_dir)
    name = _q_proj(runner)
    base = _weight(runner, name)
    base_text = _generate(runner)

    runner.swap_adapter(adapter)
    assert runner.model_id == f"{runner.base_model_id}+v0003"
    assert not any("lora" in n for n, _ in runner.model.named_parameters())  # merged, no layers
    # W + (alpha / rank) * B @ A, rounded once to bfloat16.
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    a = next(t for k, t in tensors.items() if f"{name}.lora_A" in k)
    b = next(t for k, t in tensors.items() if f"{name}.lora_B" in k)
    expected = (base + 2.0 * b.float() @ a.float()).to(torch.bfloat16).float()
    merged = _weight(runner, name)
    assert not torch.equal(merged, base)
    assert torch.allclose(merged, expected, atol=2e-2 * float(expected.abs().max()))
    _generate(runner)  # decodes with the adapter (what it says is not asserted)

    runner.swap_adapter(None)
    assert runner.model_id == runner.base_model_id
    assert torch.equal(_weight(runner, name), base)
    assert _generate(runner) == base_text


def test_a_bad_adapter_leaves_the_serving_weights(
    tiny_model_path: Path, cache_dir: Path, adapter: Path, tmp_path: Path
) -> None:
    import shutil

    runner = _runner(tiny_model_path, cache_dir)
    name = _q_proj(runner)
    base = _weight(runner, name)
    bad = tmp_path / "bad"
    shutil.copytree(adapter, bad)
    damage.flip_byte(bad)
    with pytest.raises(AdapterError):
        runner.swap_adapter(bad)
    assert runner.adapter is None
    assert torch.equal(_weight(runner, name), base)


def test_the_runner_follows_the_completion_runners_adapter(
    tiny_model_path: Path, cache_dir: Path, adapter: Path
) -> None:
    runner = _runner(tiny_model_path, cache_dir, adapter)
    assert runner.adapter == adapter  # loaded with the settings' adapter
    serving = TorchRunner(str(tiny_model_path), cache_dir, threads=1, adapter=adapter)
    follow_adapter(runner, serving)
    assert runner.adapter == adapter
    serving.swap_adapter(None)  # the completion runner goes back to the base model
    follow_adapter(runner, serving)
    assert runner.adapter is None and runner.model_id == runner.base_model_id
    serving.swap_adapter(adapter)
    follow_adapter(runner, serving)
    assert runner.model_id.endswith("+v0003")
    follow_adapter(runner, object())  # a runner without adapters (an HTTP server's) says nothing
    assert runner.adapter == adapter


def _generate(runner: TorchRunner) -> str:
    return runner.generate(
        "def add(a, b):\n    return", max_new_tokens=6, stop=lambda _: None, cancel=CancelToken()
    ).text
