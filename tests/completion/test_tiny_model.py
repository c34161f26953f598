"""The tiny test model's build: cached, and safe when two processes build at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import tiny_model


def fake_training(target_holder: dict[str, Path], racer: bool) -> tuple[object, object]:
    def train_tokenizer(texts: list[str], work: Path) -> object:
        (work / "tokenizer.json").write_text("{}")
        return object()

    def train_model(tokenizer: object, examples: list[str], work: Path) -> None:
        (work / "config.json").write_text('{"built_by": "loser"}')
        if racer:
            # Another process finishes first, while this one is still training.
            winner = target_holder["target"]
            winner.mkdir()
            (winner / "config.json").write_text('{"built_by": "winner"}')

    return train_tokenizer, train_model


@pytest.mark.parametrize("racer", [pytest.param(False, id="alone"), pytest.param(True, id="race")])
def test_build_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, racer: bool) -> None:
    target = tmp_path / "tiny-model-v1"
    train_tokenizer, train_model = fake_training({"target": target}, racer)
    monkeypatch.setattr(tiny_model, "_train_tokenizer", train_tokenizer)
    monkeypatch.setattr(tiny_model, "_train_model", train_model)
    assert tiny_model.build_tiny_model(target) == target
    expected = "winner" if racer else "loser"
    assert expected in (target / "config.json").read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["tiny-model-v1"], "temporary dir removed"


def test_built_model_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "tiny"
    target.mkdir()
    (target / "config.json").write_text("{}")

    def fail(*args: object) -> None:
        raise AssertionError("a built model must not be rebuilt")

    monkeypatch.setattr(tiny_model, "_train_model", fail)
    assert tiny_model.build_tiny_model(target) == target


def test_fixture_model_has_qwen_fim_tokens(tiny_model_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    vocab = tokenizer.get_vocab()
    for token in tiny_model.SPECIAL_TOKENS:
        assert token in vocab
        assert tokenizer.convert_ids_to_tokens(tokenizer(token)["input_ids"]) == [token]
