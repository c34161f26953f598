"""LoRA adapters (peft) on the completion model, for training: fresh, or warm from a version."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from completion.adapters import CONFIG, AdapterError

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraShape:
    rank: int = 16
    alpha: int = 32
    # Off: the dropout made peft cast each projection's input to float32 and keep a dropped copy
    # of it for the backward pass, about 30% of a step's time and 0.8 GB of one full-length
    # example's peak on this CPU (docs/learning.md, `tabloop bench train`). A run trains on each
    # example about once, where dropout has little to regularise.
    dropout: float = 0.0
    targets: tuple[str, ...] = DEFAULT_TARGETS


def lora_config(model: Any, shape: LoraShape) -> Any:
    """peft's `LoraConfig` of `shape` on `model`: its targets are those the model has."""
    from peft import LoraConfig

    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    targets = [t for t in shape.targets if t in names]
    if not targets:
        raise AdapterError(f"the model has none of the LoRA target modules {shape.targets}")
    return LoraConfig(
        r=shape.rank,
        lora_alpha=shape.alpha,
        lora_dropout=shape.dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )


def attach_lora(model: Any, shape: LoraShape) -> Any:
    """`model` wrapped by peft with fresh LoRA weights; only they are trainable."""
    from peft import get_peft_model

    return get_peft_model(model, lora_config(model, shape))


def lora_mismatch(adapter: Path, config: Any) -> str | None:
    """How the LoRA configuration of the adapter in `adapter` differs from `config` (rank,
    alpha, target modules), or None when a run of `config` can start from it. The dropout is not
    part of the weights: a run continues from an adapter trained with another one, with its own
    (`load_lora`)."""
    try:
        saved = json.loads((adapter / CONFIG).read_text())
    except (OSError, ValueError) as exc:
        return f"its {CONFIG} cannot be read ({exc})"
    wanted = {
        "r": config.r,
        "lora_alpha": config.lora_alpha,
        "target_modules": sorted(config.target_modules),
    }
    found = {name: saved.get(name) for name in wanted}
    if isinstance(found["target_modules"], list):
        found["target_modules"] = sorted(found["target_modules"])
    differ = [
        f"{name} {found[name]} (this run: {wanted[name]})"
        for name in wanted
        if found[name] != wanted[name]
    ]
    return "its LoRA shape differs: " + ", ".join(differ) if differ else None


def load_lora(model: Any, adapter: Path, config: Any = None) -> Any:
    """`model` wrapped by peft with the weights of the adapter in `adapter`, trainable; with
    `config` (a `LoraConfig` that `lora_mismatch` accepts for it), trained with that
    configuration's dropout instead of the saved one."""
    from peft import PeftModel

    if config is None:
        return PeftModel.from_pretrained(model, str(adapter), is_trainable=True)
    return PeftModel.from_pretrained(model, str(adapter), is_trainable=True, config=config)
