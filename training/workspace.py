"""Training an adapter for one workspace: its code (less held-out files) and its local feedback."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from completion.fim import detect_family, template_for
from completion.runners.loading import load_model, resolve_source
from training.examples import FimExample, split_files, stream_code_examples, workspace_files
from training.feedback import FeedbackStore, stream_feedback_examples
from training.lora import attach_lora
from training.trainer import Budget, Progress, Trainer, TrainResult, TrainSettings, mixed_stream

FEEDBACK_SHARE = 0.5


@dataclass
class TrainableModel:
    """The base model wrapped with a fresh LoRA adapter, and what the trainer needs around it."""

    tokenizer: Any
    model: Any
    base_model_id: str
    family: str


def load_trainable(model: str, cache_dir: Path, settings: TrainSettings) -> TrainableModel:
    """`model` (a `completion.model` value) in float32 with LoRA layers on it; the base model's
    identity is the one the local runner serves it under, so the adapter fits it."""
    import torch

    source = resolve_source(model, cache_dir)
    tokenizer, base = load_model(source, "float32", cache_dir)
    torch.manual_seed(settings.seed)  # the adapter's initial weights come from the seed
    specials = list(getattr(tokenizer, "all_special_tokens", []))
    specials += list(tokenizer.get_added_vocab().keys())
    family = detect_family(specials, source.location + "/" + source.name)
    return TrainableModel(
        tokenizer, attach_lora(base, settings.lora), f"{source.name}@{source.revision}", family
    )


def example_stream(
    root: Path,
    train_files: Sequence[str],
    seed: int,
    feedback: FeedbackStore | None,
    feedback_upto: int,
) -> Callable[[], Iterator[FimExample]]:
    """A factory of the run's example stream (the same sequence every time it is called)."""

    def make() -> Iterator[FimExample]:
        code = stream_code_examples(root, train_files, seed)
        notes = (
            stream_feedback_examples(feedback, feedback_upto)
            if feedback is not None and feedback_upto > 0
            else None
        )
        return mixed_stream(code, notes, FEEDBACK_SHARE)

    return make


def train_workspace(
    root: Path,
    *,
    model: str,
    cache_dir: Path,
    work_dir: Path,
    budget: Budget,
    settings: TrainSettings,
    feedback: FeedbackStore | None = None,
    exclude: Sequence[str] = (),
    on_progress: Callable[[Progress], None] | None = None,
    device: str | None = None,
    code: bool = True,
) -> tuple[TrainResult, list[str]]:
    """Train in `work_dir` (resuming there) on `root`'s training files (none with `code` off:
    feedback alone) and `feedback`; (result, held-out files)."""
    train_files, held_out = split_files(workspace_files(root, exclude))
    if not code:
        train_files = []
    if not train_files and (feedback is None or feedback.count() == 0):
        raise ValueError(f"{root}: no code files to train on")
    trainable = load_trainable(model, cache_dir, settings)
    upto = _feedback_mark(work_dir, feedback)
    trainer = Trainer(
        trainable.model,
        trainable.tokenizer,
        template_for(trainable.family),
        trainable.base_model_id,
        settings,
        work_dir,
        device=device,
    )
    stream = example_stream(root, train_files, settings.seed, feedback, upto)
    return trainer.run(stream, budget, on_progress), held_out


def _feedback_mark(work_dir: Path, feedback: FeedbackStore | None) -> int:
    """The newest feedback row this run trains on, fixed at its first start (a resumed run must
    see the same rows)."""
    if feedback is None:
        return 0
    mark = work_dir / "feedback-upto"
    if mark.is_file():
        return int(mark.read_text().strip() or 0)
    work_dir.mkdir(parents=True, exist_ok=True)
    upto = feedback.last_id()
    mark.write_text(f"{upto}\n")
    return upto
