"""A fresh LoRA adapter (peft) on the completion model, for training."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from completion.adapters import AdapterError

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraShape:
    rank: int = 16
    alpha: int = 32
    dropout: float = 0.05
    targets: tuple[str, ...] = DEFAULT_TARGETS


def attach_lora(model: Any, shape: LoraShape) -> Any:
    """`model` wrapped by peft with fresh LoRA weights; only they are trainable."""
    from peft import LoraConfig, get_peft_model

    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [t for t in shape.targets if t in names]
    if not targets:
        raise AdapterError(f"the model has none of the LoRA target modules {shape.targets}")
    config = LoraConfig(
        r=shape.rank,
        lora_alpha=shape.alpha,
        lora_dropout=shape.dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)
