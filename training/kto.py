"""The other objective: trl's `KTOTrainer` on the window's accepted and rejected suggestions.

KTO (Ethayarajh et al., 2024, "KTO: Model Alignment as Prospect Theoretic Optimization") takes
unpaired feedback, each completion marked desirable or not, and a reference model, which is what
the feedback store holds: a suggestion with a positive advantage (accepted, or partly accepted
above the window's mean reward) is desirable, one with a negative advantage (ignored, dismissed)
is not. The prompt is the model's own FIM prompt of the logged prefix and suffix, the completion
the suggestion followed by end of text. The reference is the base model (trl disables the LoRA
layers of a peft model for it). Code examples are not used: KTO needs a label and a reference,
and the supervised term of `training.trainer` already covers the code.

trl's trainer keeps its own loop (transformers' `Trainer`): a run of this objective makes one
pass over the window's labelled suggestions (or `--samples` of them; a wall-clock budget does not
stop it), is not checkpointed and does not resume; killed, it starts over.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from completion.adapters import save_adapter
from completion.fim import FimTemplate
from training.examples import FimExample
from training.trainer import TrainResult, TrainSettings, encode

KTO_BETA = 0.1
"""trl's default: how far from the reference the policy may move (higher: less)."""


@dataclass(frozen=True)
class KtoResult:
    steps: int
    samples: int
    desirable: int
    undesirable: int
    loss: float
    adapter: str


def kto_rows(
    examples: Iterable[FimExample],
    tokenizer: Any,
    template: FimTemplate,
    settings: TrainSettings,
    limit: int,
) -> list[dict[str, Any]]:
    """Up to `limit` feedback examples as trl's unpaired-preference rows (prompt, completion,
    label), cut as the trainer cuts them (`encode`: the prompt to `max_prompt_tokens`, the
    suggestion to `max_middle_tokens` with end of text); code examples and suggestions with a
    zero advantage carry no label and are left out."""
    rows: list[dict[str, Any]] = []
    for example in examples:
        if len(rows) >= limit:
            break
        if example.source != "feedback" or example.advantage == 0:
            continue
        encoded = encode(
            example, tokenizer, template, settings.max_prompt_tokens, settings.max_middle_tokens
        )
        if encoded is None:
            continue
        rows.append(
            {
                "prompt": tokenizer.decode(encoded.ids[: encoded.prompt_len]),
                "completion": tokenizer.decode(encoded.ids[encoded.prompt_len :]),
                "label": example.advantage > 0,
            }
        )
    return rows


def run_kto(
    model: Any,
    tokenizer: Any,
    template: FimTemplate,
    base_model_id: str,
    examples: Iterator[FimExample],
    settings: TrainSettings,
    limit: int,
    work_dir: Path,
    device: str,
) -> TrainResult:
    """`train_kto` on up to `limit` feedback examples of `examples`, one pass, reported as the
    trainer reports a run."""
    started = time.perf_counter()
    rows = kto_rows(examples, tokenizer, template, settings, limit)
    result = train_kto(
        model,
        tokenizer,
        base_model_id,
        rows,
        work_dir,
        seed=settings.seed,
        learning_rate=settings.learning_rate,
        batch=settings.effective_batch,
        max_length=settings.max_prompt_tokens + settings.max_middle_tokens + 8,
    )
    elapsed = time.perf_counter() - started
    rate = result.samples / elapsed if elapsed > 0 else 0.0
    return TrainResult(
        steps=result.steps,
        samples=result.samples,
        tokens=0,
        elapsed_s=round(elapsed, 2),
        samples_per_s=round(rate, 3),
        seconds_per_1000_examples=round(1000 / rate, 1) if rate else 0.0,
        loss=result.loss,
        micro_batch=settings.effective_batch,
        accumulation=1,
        device=device,
        resumed_from_step=0,
        refused_checkpoints=[],
        peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        adapter=result.adapter,
        stream_ended=True,
        settings=asdict(settings),
    )


def train_kto(
    model: Any,
    tokenizer: Any,
    base_model_id: str,
    rows: list[dict[str, Any]],
    work_dir: Path,
    *,
    seed: int,
    learning_rate: float,
    batch: int,
    max_length: int,
    beta: float = KTO_BETA,
) -> KtoResult:
    """Train the peft `model` on `rows` (one pass) and write the adapter to `work_dir/adapter`."""
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import KTOConfig, KTOTrainer

    desirable = sum(1 for row in rows if row["label"])
    if not rows or desirable in (0, len(rows)):
        raise ValueError(
            f"KTO needs both accepted and rejected suggestions ({desirable} accepted, "
            f"{len(rows) - desirable} rejected)"
        )
    if batch < 2:
        raise ValueError("KTO's reference KL estimate needs a batch of at least 2")
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    config = KTOConfig(
        output_dir=str(work_dir / "kto"),
        per_device_train_batch_size=batch,
        num_train_epochs=1,
        learning_rate=learning_rate,
        beta=beta,
        max_length=max_length,
        seed=seed,
        use_cpu=not _cuda(),
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        # Equal total weight for each side (trl's advice for unbalanced data).
        desirable_weight=max(1.0, (len(rows) - desirable) / desirable),
        undesirable_weight=max(1.0, desirable / (len(rows) - desirable)),
    )
    trainer = KTOTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    # Without a progress bar, transformers prints each step's log on stdout, which is the
    # report of `tabloop train model --json` (read by the background loop) and of the benches;
    # the steps' logs stay in `trainer.state.log_history`.
    trainer.remove_callback(PrinterCallback)
    output = trainer.train()
    adapter = work_dir / "adapter"
    save_adapter(
        trainer.model,
        adapter,
        base_model_id,
        {"objective": "kto", "steps": output.global_step, "samples": len(rows), "seed": seed},
    )
    return KtoResult(
        steps=int(output.global_step),
        samples=len(rows),
        desirable=desirable,
        undesirable=len(rows) - desirable,
        loss=round(float(output.training_loss), 4),
        adapter=str(adapter),
    )


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())
