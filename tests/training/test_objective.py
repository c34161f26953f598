"""The cheaper objective on the tiny model: the LM head at the middle's positions only gives the
loss and gradients of full logits; the KL anchor is zero at its reference and positive away from
it; the micro-batch sizing follows the settings."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from completion.fim import template_for
from training.edit_examples import EditExample
from training.examples import FimExample
from training.lora import LoraShape
from training.memory import bytes_per_example, size_micro_batch
from training.objective import Reference, ReferenceModel, middle_logits, pack, per_row_mean
from training.trainer import Trainer, TrainSettings, _Encoded, encode
from training.workspace import load_trainable

EXACT = TrainSettings(
    micro_batch=3,
    effective_batch=3,
    max_prompt_tokens=64,
    lora=LoraShape(rank=4, alpha=8, dropout=0.0),
    base_dtype="float32",
    autocast=False,
    checkpointing=False,
)
EXAMPLES = [
    FimExample("a.py", "def add(a, b):\n    return ", "a + b", "\n\nprint(add(1, 2))\n", "line"),
    FimExample("b.py", "import os\n\npath = os.path.", "join('x', 'y')", "\n", "call"),
    FimExample(
        "c.py",
        "class Point:\n    def __init__(self, x, y):\n        ",
        "self.x = x\n        self.y = y",
        "\n\n    def norm(self):\n        return (self.x ** 2 + self.y ** 2) ** 0.5\n",
        "block",
    ),
]


def _trainer(model_path: Path, tmp_path: Path, settings: TrainSettings) -> Trainer:
    trainable = load_trainable(str(model_path), tmp_path / "cache", settings)
    return Trainer(
        trainable.model,
        trainable.tokenizer,
        template_for(trainable.family),
        trainable.base_model_id,
        settings,
        tmp_path / "run",
        device="cpu",
    )


def _encoded(trainer: Trainer) -> list[_Encoded]:
    batch = [
        encode(e, trainer.tokenizer, trainer.template, 64, trainer.settings.max_middle_tokens)
        for e in EXAMPLES
    ]
    assert all(b is not None for b in batch)
    lengths = {len(b.ids) for b in batch if b is not None}
    assert len(lengths) == len(batch)  # padding is exercised
    return [b for b in batch if b is not None]


def _perturb(model: Any, seed: int = 1) -> None:
    """Move every LoRA weight away from its value (B starts at zero: the adapter changes
    nothing until it moves)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn(p.shape, generator=generator))


def _grads(model: Any) -> dict[str, torch.Tensor]:
    return {
        n: p.grad.detach().clone()
        for n, p in model.named_parameters()
        if p.requires_grad and p.grad is not None
    }


def _loss_and_grads(trainer: Trainer, batch: list[_Encoded]) -> tuple[float, dict[str, Any]]:
    trainer.model.zero_grad(set_to_none=True)
    loss, _nll = trainer._micro_loss(batch)
    loss.backward()
    return float(loss.detach()), _grads(trainer.model)


def test_middle_only_logits_equal_the_full_logits_at_the_targets(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    trainer = _trainer(tiny_model_path, tmp_path, EXACT)
    _perturb(trainer.model)
    packed = pack([(e.ids, e.prompt_len) for e in _encoded(trainer)], trainer._pad)
    full = trainer.model(
        input_ids=packed.ids, attention_mask=packed.mask, position_ids=packed.positions
    ).logits
    at_targets = full[packed.rows, packed.columns]
    middle = middle_logits(trainer.model, packed, "cpu")
    assert middle.shape == (int(packed.counts.sum()), full.shape[-1])
    assert middle.shape[0] < full.shape[0] * full.shape[1]  # fewer positions than full logits
    torch.testing.assert_close(middle, at_targets, rtol=1e-5, atol=1e-5)
    # The targets are the tokens that follow each predicting position.
    assert torch.equal(packed.ids[packed.rows, packed.columns + 1], packed.targets)

    mean = per_row_mean(torch.log_softmax(middle, -1)[range(len(middle)), packed.targets], packed)
    full_logprobs = torch.log_softmax(full, -1)
    expected = []
    for row in range(packed.size):
        picked = packed.rows == row
        tokens = full_logprobs[row, packed.columns[picked], packed.targets[picked]]
        expected.append(tokens.mean())
    torch.testing.assert_close(mean, torch.stack(expected), rtol=1e-5, atol=1e-5)


def test_weights_average_a_rows_middle_tokens_by_their_weight() -> None:
    packed = pack([([1, 2, 3, 4], 2), ([5, 6, 7], 1)], 0, [[1.0, 3.0], None])
    values = torch.tensor([1.0, 2.0, 4.0, 6.0])  # row 0's two middle tokens, then row 1's
    torch.testing.assert_close(
        per_row_mean(values, packed, packed.weights), torch.tensor([7.0 / 4, 5.0])
    )
    torch.testing.assert_close(per_row_mean(values, packed), torch.tensor([1.5, 5.0]))
    assert pack([([1, 2, 3], 1)], 0, [None]).weights is None
    with pytest.raises(ValueError, match="3 weights for a middle of 2 tokens"):
        pack([([1, 2, 3, 4], 2)], 0, [[1.0, 1.0, 1.0]])


def test_a_weighted_edit_example_trains_on_the_weighted_mean_on_either_loss_path(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    example = EditExample("e.py", "p\n", "a = 1\nb = 2\n", "a = 1\nb = 20\n", "live").fim()
    trainers = [
        _trainer(tiny_model_path, tmp_path / name, replace(EXACT, middle_only=middle_only))
        for name, middle_only in (("new", True), ("old", False))
    ]
    losses = []
    for trainer in trainers:
        _perturb(trainer.model)
        plain = encode(example, trainer.tokenizer, trainer.template, 64, 64)
        weighted = encode(example, trainer.tokenizer, trainer.template, 64, 64, 4.0)
        assert plain is not None and weighted is not None and weighted.token_weights
        loss_plain, _ = _loss_and_grads(trainer, [plain])
        loss_weighted, grads = _loss_and_grads(trainer, [weighted])
        packed = pack([(plain.ids, plain.prompt_len)], trainer._pad)
        with torch.no_grad():
            logits = middle_logits(trainer.model, packed, "cpu")
            nll = -torch.log_softmax(logits, -1)[range(len(logits)), packed.targets]
        weights = torch.tensor(weighted.token_weights)
        scale = 1 / trainer.settings.effective_batch
        assert loss_plain == pytest.approx(float(nll.mean()) * scale, rel=1e-5)
        assert loss_weighted == pytest.approx(
            float((nll * weights).sum() / weights.sum()) * scale, rel=1e-5
        )
        assert loss_weighted != pytest.approx(loss_plain, rel=1e-3) and grads
        losses.append(loss_weighted)
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_the_middle_only_loss_and_its_gradients_equal_the_last_positions_loss(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    new = _trainer(tiny_model_path, tmp_path / "new", EXACT)
    old = _trainer(tiny_model_path, tmp_path / "old", replace(EXACT, middle_only=False))
    _perturb(new.model)
    _perturb(old.model)
    batch = _encoded(new)
    loss_new, grads_new = _loss_and_grads(new, batch)
    loss_old, grads_old = _loss_and_grads(old, batch)
    assert loss_new == pytest.approx(loss_old, rel=1e-5)
    assert grads_new.keys() == grads_old.keys() and grads_new
    for name in grads_new:
        torch.testing.assert_close(grads_new[name], grads_old[name], rtol=1e-4, atol=1e-6)


def test_checkpointing_every_second_layer_leaves_the_others_their_activations(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    settings = replace(EXACT, checkpointing=True, checkpointing_every=2)
    trainer = _trainer(tiny_model_path, tmp_path / "every2", settings)
    layers = trainer.model.get_base_model().model.layers
    assert len(layers) >= 2
    assert [layer.gradient_checkpointing for layer in layers] == [
        k % 2 == 0 for k in range(len(layers))
    ]
    with pytest.raises(ValueError, match="checkpointing_every"):
        replace(EXACT, checkpointing_every=0)


def test_bf16_autocast_and_checkpointing_give_close_losses_and_gradients(
    tiny_model_path: Path, tmp_path: Path
) -> None:
    exact = _trainer(tiny_model_path, tmp_path / "exact", EXACT)
    cheap_settings = replace(EXACT, base_dtype="bfloat16", autocast=True, checkpointing=True)
    cheap = _trainer(tiny_model_path, tmp_path / "cheap", cheap_settings)
    assert cheap.model.get_base_model().model.embed_tokens.weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in cheap.model.parameters() if p.requires_grad)
    _perturb(exact.model)
    _perturb(cheap.model)
    exact.model.train()
    cheap.model.train()  # activation checkpointing recomputes only in training mode
    batch = _encoded(exact)
    loss_exact, grads_exact = _loss_and_grads(exact, batch)
    loss_cheap, grads_cheap = _loss_and_grads(cheap, batch)
    assert loss_cheap == pytest.approx(loss_exact, rel=0.02)
    assert grads_cheap.keys() == grads_exact.keys()
    for name in grads_exact:
        a, b = grads_exact[name].flatten(), grads_cheap[name].flatten()
        assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.98, name


@pytest.mark.parametrize("reference", ["base", "start"])
def test_the_kl_anchor_is_zero_at_its_reference_and_positive_away_from_it(
    tiny_model_path: Path, tmp_path: Path, reference: str
) -> None:
    settings = replace(EXACT, kl_weight=1.0, kl_reference=reference)  # type: ignore[arg-type]
    trainer = _trainer(tiny_model_path, tmp_path, settings)
    batch = _encoded(trainer)
    _mean, kl = trainer._mean_logprobs(batch)  # a fresh adapter: the base model's outputs
    assert kl is not None and kl.shape == (len(batch),)
    torch.testing.assert_close(kl, torch.zeros(len(batch)), rtol=0, atol=1e-6)

    _perturb(trainer.model)  # the adapter moves away from both references
    _mean, kl = trainer._mean_logprobs(batch)
    assert bool((kl > 1e-4).all()), kl
    loss, _nll = trainer._micro_loss(batch)
    loss.backward()  # the anchor's gradient reaches the LoRA weights
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.model.parameters())

    if reference == "start":  # a reference taken now (a warm start from here): zero again
        trainer.reference = ReferenceModel(trainer.model, "start")
        _perturb(trainer.model, seed=2)
        weights = [p.detach().clone() for p in trainer.model.parameters() if p.requires_grad]
        _mean, kl = trainer._mean_logprobs(batch)
        assert bool((kl > 1e-4).all()), kl
        after = [p for p in trainer.model.parameters() if p.requires_grad]
        assert all(torch.equal(a, b) for a, b in zip(weights, after, strict=True))  # restored
        with torch.no_grad():
            for p, start in zip(after, trainer.reference._start.values(), strict=True):
                p.copy_(start)
        _mean, kl = trainer._mean_logprobs(batch)
        torch.testing.assert_close(kl, torch.zeros(len(batch)), rtol=0, atol=1e-6)


@pytest.mark.parametrize("reference", ["base", "start"])
def test_the_reference_pass_leaves_the_adapted_pass_alone_under_bfloat16_autocast(
    tiny_model_path: Path, tmp_path: Path, reference: Reference
) -> None:
    """The reference runs in the adapted pass's autocast region. Autocast caches a weight's
    bfloat16 copy for the whole region; the `start` reference swaps the LoRA weights in place,
    so a cached copy made for it must not serve the adapted pass (it did: the KL read zero, half
    the LoRA weights got no gradient, and training diverged)."""
    settings = replace(
        EXACT, kl_weight=1.0, kl_reference=reference, base_dtype="bfloat16", autocast=True
    )
    trainer = _trainer(tiny_model_path, tmp_path, settings)
    _perturb(trainer.model)
    trainer.model.train()
    batch = _encoded(trainer)

    def nll_and_grads(with_reference: bool) -> tuple[torch.Tensor, Any, dict[str, Any]]:
        anchor = trainer.reference
        trainer.reference = anchor if with_reference else None
        try:
            trainer.model.zero_grad(set_to_none=True)
            mean, kl = trainer._mean_logprobs(batch)
            (-mean.sum()).backward()
            return mean.detach(), kl, _grads(trainer.model)
        finally:
            trainer.reference = anchor

    plain, _none, plain_grads = nll_and_grads(with_reference=False)
    anchored, kl, anchored_grads = nll_and_grads(with_reference=True)
    torch.testing.assert_close(anchored, plain, rtol=0, atol=0)
    assert kl is not None and bool((kl > 1e-4).all()), kl  # the adapter moved off the reference
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert sorted(anchored_grads) == sorted(plain_grads) == sorted(trainable)
    for name in trainable:
        torch.testing.assert_close(anchored_grads[name], plain_grads[name], rtol=0, atol=0)


def test_the_kl_anchor_needs_the_middle_only_head_and_a_known_reference() -> None:
    with pytest.raises(ValueError, match="middle_only"):
        TrainSettings(kl_weight=0.1, middle_only=False)
    with pytest.raises(ValueError, match="kl_reference"):
        TrainSettings(kl_reference="serving")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="base_dtype"):
        TrainSettings(base_dtype="int8")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 0"):
        TrainSettings(kl_weight=-1)


class _Qwen05:
    """The shape of Qwen2.5-Coder-0.5B's configuration."""

    hidden_size = 896
    num_hidden_layers = 24
    intermediate_size = 4864
    num_attention_heads = 14
    vocab_size = 151_936


def test_memory_per_example_follows_the_settings() -> None:
    today = bytes_per_example(_Qwen05(), 456, 65)
    assert 2.5e9 < today < 3.5e9  # the fitted measurement: about 3 GB in float32
    bf16 = bytes_per_example(_Qwen05(), 456, 65, element_bytes=3)
    checkpointed = bytes_per_example(_Qwen05(), 456, 65, element_bytes=3, checkpointing=True)
    with_kl = bytes_per_example(_Qwen05(), 456, 65, element_bytes=3, checkpointing=True, kl=True)
    assert today > bf16 > 5 * checkpointed
    assert with_kl > checkpointed


def test_the_micro_batch_is_sized_from_the_settings_memory(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sized = replace(EXACT, micro_batch=0, effective_batch=8)
    trainable = load_trainable(str(tiny_model_path), tmp_path, sized)
    sequence = sized.max_prompt_tokens + sized.max_middle_tokens + 8
    config = trainable.model.config

    def estimate(settings: TrainSettings) -> int:
        return bytes_per_example(
            config,
            sequence,
            settings.max_middle_tokens + 1,
            element_bytes=3 if settings.low_precision else 4,
            checkpointing=settings.checkpointing,
        )

    # A third of the free memory holds eight examples of the cheapest estimate.
    free = 3 * 8 * estimate(replace(sized, checkpointing=True, autocast=True))
    monkeypatch.setattr("training.trainer.available_memory_bytes", lambda device: free)

    def on_gpu(settings: TrainSettings) -> int:
        return size_micro_batch(settings.effective_batch, "cuda", free, estimate(settings))

    assert on_gpu(sized) == 2  # float32, every activation kept: three fit, two divide 8
    assert on_gpu(replace(sized, checkpointing=True)) == 4
    assert on_gpu(replace(sized, checkpointing=True, base_dtype="bfloat16")) == 8
    assert on_gpu(replace(sized, checkpointing=True, autocast=True)) == 8
    # The trainer on a CPU takes one example a pass, whatever the memory.
    trainer = Trainer(
        trainable.model, trainable.tokenizer, template_for(trainable.family),
        trainable.base_model_id, sized, tmp_path / "run", device="cpu",
    )  # fmt: skip
    assert trainer.micro_batch == 1 and trainer.accumulation == 8
