"""Linear layers packed for oneDNN (`completion.runners.packed`): the same products, and a model
left as loaded where packing does not work."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from completion.runners import packed
from completion.runners.loading import load_model
from completion.runners.packed import PackedLinear, pack_linears, packed_bytes, packing_works
from completion.runners.torch_runner import resolve_source


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(5, 32), (1, 7, 32)])
def test_a_packed_linear_computes_what_the_linear_does(bias: bool, shape: tuple[int, ...]) -> None:
    generator = torch.Generator().manual_seed(3)
    linear = nn.Linear(32, 24, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(24, 32, generator=generator))
        if bias:
            linear.bias.copy_(torch.randn(24, generator=generator))
    x = torch.randn(*shape, generator=generator)
    layer = PackedLinear(linear)
    with torch.inference_mode():
        expected, found = linear(x), layer(x)
    assert found.shape == expected.shape
    assert torch.allclose(found, expected, atol=1e-4, rtol=1e-4)
    assert torch.equal(layer.dense_weight(), linear.weight.detach())
    assert layer.packed_bytes == 24 * 32 * 4


def _tiny(tiny_model_path: Path, cache_dir: Path) -> nn.Module:
    _, model = load_model(resolve_source(str(tiny_model_path), cache_dir), "float32", cache_dir)
    return model


IDS = torch.tensor([[3, 17, 42, 8, 99, 5]])


def test_the_decoder_projections_are_packed_and_a_tied_head_is_not(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    model = _tiny(tiny_model_path, tmp_path)
    layers = model.model.layers
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the tiny model ties them
    with torch.inference_mode():
        before = model(input_ids=IDS).logits
    assert pack_linears(model) == 7 * len(layers)
    assert type(model.lm_head) is nn.Linear
    assert not any(type(m) is nn.Linear for m in layers.modules())
    assert packed_bytes(model) > 0
    with torch.inference_mode():
        after = model(input_ids=IDS).logits
    assert torch.allclose(after, before, atol=1e-3, rtol=1e-3)


def test_a_head_of_its_own_is_packed(tiny_model_path: Path, tmp_path: Path) -> None:
    model = _tiny(tiny_model_path, tmp_path)
    model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())  # untied
    with torch.inference_mode():
        before = model(input_ids=IDS).logits
    assert pack_linears(model) == 7 * len(model.model.layers) + 1
    assert isinstance(model.lm_head, PackedLinear)
    with torch.inference_mode():
        after = model(input_ids=IDS).logits
    assert torch.allclose(after, before, atol=1e-3, rtol=1e-3)


def test_where_packing_fails_the_model_stays_as_loaded(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unavailable(*args: object) -> None:
        raise RuntimeError("no oneDNN here")

    monkeypatch.setattr(packed, "_reorder", unavailable)
    assert not packing_works()
    model = _tiny(tiny_model_path, tmp_path)
    assert pack_linears(model) == 0
    assert type(model.model.layers[0].self_attn.q_proj) is nn.Linear


def test_a_model_without_decoder_layers_is_left_alone() -> None:
    assert pack_linears(nn.Sequential(nn.Linear(4, 4))) == 0
