"""Keeping a converted (dequantised) copy of a model, and loading it back."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from completion.runners.loading import ModelSource, converted_path, load_model, save_converted


def test_converted_copy_loads_back_identical(tiny_model_path: Path, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    # Models loaded from GGUF carry a quantisation entry that must not survive the copy.
    model.config.quantization_config = {"quant_method": "gguf"}
    target = tmp_path / "converted" / "tiny-abc"
    assert save_converted(tokenizer, model, target)
    assert (target / ".complete").is_file()
    assert [p.name for p in target.parent.iterdir()] == ["tiny-abc"], "no temporary directory"

    copy = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    assert not hasattr(copy.config, "quantization_config")
    ids = torch.tensor([tokenizer("def f(x):\n    return x")["input_ids"]])
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, copy(ids).logits)
    assert copy.lm_head.weight.data_ptr() == copy.model.embed_tokens.weight.data_ptr()
    assert (
        AutoTokenizer.from_pretrained(target)("x = 1")["input_ids"]
        == tokenizer("x = 1")["input_ids"]
    )


def test_existing_copy_is_kept(tiny_model_path: Path, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    target = tmp_path / "tiny-abc"
    assert save_converted(tokenizer, model, target)
    # A second process finishing later finds the copy in place and keeps it.
    assert save_converted(tokenizer, model, target)
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-abc"]


def test_a_bfloat16_load_keeps_a_bfloat16_copy_and_reads_it_later(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # A GGUF model whose float32 copy is already kept (the GGUF itself is not read then).
    source = ModelSource(str(tmp_path / "gguf"), "tiny.gguf", "tiny", "abc")
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    full = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    assert save_converted(tokenizer, full, converted_path(source, tmp_path))
    halved = converted_path(source, tmp_path, "bfloat16")
    assert not halved.exists()

    _, first = load_model(source, "bfloat16", tmp_path)
    assert (halved / ".complete").is_file()
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(str(halved / "model.safetensors")).values()} == {
        torch.bfloat16
    }
    # The float32 copy gone (and no GGUF file to dequantise), a bfloat16 load reads the bfloat16
    # copy alone.
    shutil.rmtree(converted_path(source, tmp_path))
    _, second = load_model(source, "bfloat16", tmp_path)
    assert {p.dtype for p in second.parameters()} == {torch.bfloat16}
    ids = torch.tensor([tokenizer("def f(x):\n    return x")["input_ids"]])
    with torch.inference_mode():
        assert torch.equal(first(ids).logits, second(ids).logits)
    assert second.lm_head.weight.data_ptr() == second.model.embed_tokens.weight.data_ptr()
