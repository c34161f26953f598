"""Training an adapter for one workspace: its code (less held-out files), its local feedback and
the next-edit examples the server kept from the user's editing (`training.edit_store`).

What a version starts from is shared with the backend's tenant runs (`backend.adapters.run`):
`RunPlan` fixes, when a run first starts, the newest row it reads, the serving version's mark
(`training.window`) and the version whose weights it warm-starts from, so a resumed run sees the
same; `load_trainable` starts the LoRA from the serving adapter when it fits the run (same base
model, same LoRA shape), else fresh, and says why.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from common.memory import bound_primitive_cache
from completion.adapters import AdapterError, verify_adapter
from completion.fim import FimTemplate, detect_family, template_for
from completion.next_edit import NextEditSettings
from completion.runners.loading import load_model, resolve_source
from training.budget import Budget
from training.edit_examples import (
    NO_CHANGE_SHARE,
    EditExample,
    capped_no_change,
    stream_live_edits,
)
from training.edit_store import EditExampleStore
from training.examples import FimExample, split_files, stream_code_examples, workspace_files
from training.feedback import FeedbackStore, stream_feedback_examples
from training.lora import attach_lora, load_lora, lora_config, lora_mismatch
from training.registry import AdapterRegistry, AdapterRegistryError, AdapterVersions
from training.trainer import Progress, Trainer, TrainResult, TrainSettings, mixed_stream
from training.window import (
    OutcomeKey,
    TrainingWindow,
    WindowSettings,
    mark_of,
    select_window,
)

FEEDBACK_SHARE = 0.5
EDIT_SHARE = 0.2
"""Of what a run trains on, the share of next-edit examples while the workspace has any."""
EDIT_HELD_OUT_EVERY = 10
EDIT_HELD_OUT_MAX = 20
"""A run holds out the newest of every `EDIT_HELD_OUT_EVERY` next-edit examples it could read,
at most `EDIT_HELD_OUT_MAX`: the version's judgement scores next edits on them
(`training.evaluate.held_out_edits`)."""
PLAN_FILE = "plan.json"


@dataclass(frozen=True)
class WarmStart:
    """Where a run's LoRA weights start: a version's adapter (`version`), or fresh, and why."""

    version: int | None
    reason: str

    def summary(self) -> dict[str, Any]:
        name = f"v{self.version:04d}" if self.version is not None else None
        return {"from": name, "fresh": self.version is None, "reason": self.reason}


@dataclass
class TrainableModel:
    """The base model wrapped with LoRA layers, and what the trainer needs around it."""

    tokenizer: Any
    model: Any
    base_model_id: str
    family: str
    warm_start: WarmStart

    def trainer(
        self,
        settings: TrainSettings,
        work_dir: Path,
        device: str | None,
        template: FimTemplate | None = None,
    ) -> Trainer:
        """A `Trainer` of this model, its tokenizer and `template` (default: its family's FIM
        template)."""
        return Trainer(
            self.model,
            self.tokenizer,
            template or template_for(self.family),
            self.base_model_id,
            settings,
            work_dir,
            device=device,
        )


@dataclass(frozen=True)
class RunPlan:
    """What a run trains from, fixed at its first start (a resumed run must see the same)."""

    upto: int  # the newest row it reads
    mark: OutcomeKey | None  # what the version serving then was trained up to
    serving: int | None  # the version serving then: the run warm-starts from its adapter
    edits_upto: int = 0  # the newest next-edit example it reads (`training.edit_store`)
    head: str | None = None  # the history's newest commit a next-edit run reads (edit_track)

    @classmethod
    def new(
        cls,
        registry: AdapterVersions | None,
        upto: int,
        edits_upto: int = 0,
        head: str | None = None,
    ) -> RunPlan:
        serving = registry.serving() if registry is not None else None
        if registry is None or serving is None:
            return cls(upto, None, None, edits_upto, head)
        return cls(upto, mark_of(registry.get(serving).train), serving, edits_upto, head)

    @classmethod
    def load(cls, run_dir: Path) -> RunPlan | None:
        """The plan of the run in `run_dir` (None: no run was started there)."""
        try:
            data = json.loads((run_dir / PLAN_FILE).read_text())
            mark = data["mark"]
            serving = data["serving"]
            return cls(
                int(data["upto"]),
                (float(mark[0]), int(mark[1])) if mark is not None else None,
                int(serving) if serving is not None else None,
                int(data.get("edits_upto", 0)),  # none in plans from before edits were kept
                data.get("head"),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
            raise ValueError(
                f"{run_dir / PLAN_FILE} is damaged ({exc}): start the run with --fresh"
            ) from None

    def save(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        mark = list(self.mark) if self.mark is not None else None
        # A temporary file of its own: the processes of a launched run all write the same plan.
        with tempfile.NamedTemporaryFile(
            "w", dir=run_dir, prefix=f".{PLAN_FILE}.", delete=False
        ) as handle:
            handle.write(
                json.dumps(
                    {
                        "upto": self.upto,
                        "mark": mark,
                        "serving": self.serving,
                        "edits_upto": self.edits_upto,
                        "head": self.head,
                    }
                )
            )
        os.replace(handle.name, run_dir / PLAN_FILE)

    def warm_source(self, registry: AdapterVersions | None) -> tuple[int, Path] | WarmStart:
        """The adapter to start from, or why the run starts fresh."""
        if registry is None:
            return WarmStart(None, "no adapter registry")
        if self.serving is None:
            return WarmStart(None, "no adapter serves: the base model")
        try:
            return self.serving, registry.path(self.serving)
        except AdapterRegistryError as exc:
            return WarmStart(None, str(exc))


def load_trainable(
    model: str,
    cache_dir: Path,
    settings: TrainSettings,
    warm_from: tuple[int, Path] | WarmStart | None = None,
) -> TrainableModel:
    """`model` (a `completion.model` value) in `settings.base_dtype` with float32 LoRA layers on
    it: the weights of
    the adapter `warm_from` names (version, directory) when it fits this run (trained on this
    base model, with this LoRA shape, and intact), else fresh ones from the seed; the base
    model's identity is the one the local runner serves it under, so the adapter fits it."""
    bound_primitive_cache()  # a training process, before its first oneDNN operation
    import torch

    source = resolve_source(model, cache_dir)
    tokenizer, base = load_model(source, settings.weights_dtype, cache_dir)
    base_model_id = f"{source.name}@{source.revision}"
    torch.manual_seed(settings.seed)  # a fresh adapter's initial weights come from the seed
    specials = list(getattr(tokenizer, "all_special_tokens", []))
    specials += list(tokenizer.get_added_vocab().keys())
    family = detect_family(specials, source.location + "/" + source.name)
    if isinstance(warm_from, WarmStart):
        warm = warm_from
    elif warm_from is None:
        warm = WarmStart(None, "not asked to warm-start")
    else:
        version, directory = warm_from
        config = lora_config(base, settings.lora)
        why = _unfit(directory, base_model_id, config)
        if why is None:
            wrapped = load_lora(base, directory, config)
            return TrainableModel(
                tokenizer,
                wrapped,
                base_model_id,
                family,
                WarmStart(version, "the serving adapter fits this run"),
            )
        warm = WarmStart(None, f"v{version:04d} does not fit: {why}")
    return TrainableModel(tokenizer, attach_lora(base, settings.lora), base_model_id, family, warm)


def _unfit(directory: Path, base_model_id: str, config: Any) -> str | None:
    try:
        verify_adapter(directory, base_model_id)
    except AdapterError as exc:
        return str(exc)
    return lora_mismatch(directory, config)


def example_stream(
    root: Path,
    train_files: Sequence[str],
    seed: int,
    feedback: FeedbackStore | None,
    window: TrainingWindow,
    rewards: dict[OutcomeKey, float],
    edits: Sequence[EditExample] = (),
) -> Callable[[], Iterator[FimExample]]:
    """A factory of the run's example stream (the same sequence every time it is called): code
    and feedback, and `EDIT_SHARE` of it next-edit examples while there are any (`edits`, newest
    first)."""

    def make() -> Iterator[FimExample]:
        code = stream_code_examples(root, train_files, seed)
        notes = (
            stream_feedback_examples(feedback, window, rewards, seed)
            if feedback is not None and window.new
            else None
        )
        completions = mixed_stream(code, notes, FEEDBACK_SHARE)
        if not edits:
            return completions
        return mixed_stream(completions, stream_live_edits(edits, seed), EDIT_SHARE)

    return make


EDIT_PROMPT_TOKENS = 1350
"""The most tokens of a next-edit example's prompt, read verbatim. At the default `nextEdit`
budgets a prompt holds up to 512 tokens of recent edits and the window twice (up to 288 tokens
each) with paths and markers; the longest of the replayed histories' examples (requests, click)
had 1,058 (`docs/next-edit.md`)."""


def edit_train_settings(settings: TrainSettings, next_edit: NextEditSettings) -> TrainSettings:
    """`settings` with room for a whole rewritten window (and its end marker) as the middle and
    a whole next-edit prompt before it."""
    middle = next_edit.window_tokens + next_edit.margin_tokens + 2
    return replace(
        settings,
        max_middle_tokens=max(settings.max_middle_tokens, middle),
        max_edit_prompt_tokens=settings.max_edit_prompt_tokens or EDIT_PROMPT_TOKENS,
    )


def live_edit_examples(
    store: EditExampleStore | None,
    upto: int,
    count_tokens: Callable[[str], int],
    settings: TrainSettings,
) -> tuple[list[EditExample], dict[str, int]]:
    """The store's examples up to `upto`, newest first, less the newest held out for judging
    (`EDIT_HELD_OUT_EVERY`), those whose prompt the trainer would cut (over `settings`'
    `edit_prompt_tokens`, as `tabloop train edits` drops them) and the no-change examples over
    `NO_CHANGE_SHARE`; with what became of them, and the ids that say which were held out
    (`upto_id`, and `trained_through_id`: the newest id trained on)."""
    if store is None or upto <= 0:
        return [], {}
    stored = store.examples(upto)
    held = min(len(stored) // EDIT_HELD_OUT_EVERY, EDIT_HELD_OUT_MAX)
    found = stored[held:]
    budget = settings.edit_prompt_tokens
    fitting = [example for example in found if count_tokens(example.prompt) <= budget]
    kept, dropped = capped_no_change(fitting, NO_CHANGE_SHARE, settings.seed)
    no_change = sum(example.no_change for example in kept)
    counts = {
        "stored": len(stored),
        "edit": len(kept) - no_change,
        "no_change": no_change,
        "held_out": held,
        "dropped_prompt_too_long": len(found) - len(fitting),
        "dropped_no_change_over_share": dropped,
        "upto_id": upto,
        "trained_through_id": store.id_below_newest(upto, held),
    }
    return kept, counts


def train_workspace(
    root: Path,
    *,
    model: str,
    cache_dir: Path,
    work_dir: Path,
    budget: Budget,
    settings: TrainSettings,
    feedback: FeedbackStore | None = None,
    edits: EditExampleStore | None = None,
    exclude: Sequence[str] = (),
    on_progress: Callable[[Progress], None] | None = None,
    device: str | None = None,
    code: bool = True,
    registry: AdapterRegistry | None = None,
    window: WindowSettings | None = None,
) -> tuple[TrainResult, list[str]]:
    """Train in `work_dir` (resuming there) on `root`'s training files (none with `code` off:
    feedback alone), the training window of `feedback` (the view of `root`'s rows) and the live
    next-edit examples of `edits`, starting from the adapter serving in `registry` when it fits;
    (result, held-out files). The result's `window`, `edit_examples` and `warm_start` say what it
    trained on and started from."""
    train_files, held_out = split_files(workspace_files(root, exclude))
    if not code:
        train_files = []
    if not train_files and (feedback is None or feedback.count() == 0):
        raise ValueError(f"{root}: no code files to train on")
    plan = RunPlan.load(work_dir)
    if plan is None:
        plan = RunPlan.new(
            registry,
            feedback.last_id() if feedback is not None else 0,
            edits.last_id() if edits is not None else 0,
        )
        plan.save(work_dir)
    rewards = dict(feedback.keys(plan.upto)) if feedback is not None else {}
    chosen = select_window(rewards, plan.mark, window or WindowSettings())
    trainable = load_trainable(model, cache_dir, settings, plan.warm_source(registry))
    if settings.objective == "kto":  # trl's loop on the feedback alone: no next-edit examples
        result = _train_kto(trainable, settings, feedback, chosen, rewards, budget, work_dir)
        result.device = device or result.device
        result.window = chosen.summary()
        result.warm_start = trainable.warm_start.summary()
        return result, held_out
    tokenizer = trainable.tokenizer
    # A next-edit prompt is longer than a completion's, and a rewritten window a longer middle.
    with_edits = edit_train_settings(settings, NextEditSettings())
    live, counts = live_edit_examples(
        edits,
        plan.edits_upto,
        lambda text: len(tokenizer.encode(text, add_special_tokens=False)),
        with_edits,
    )
    if live:
        settings = with_edits
    trainer = trainable.trainer(settings, work_dir, device)
    stream = example_stream(root, train_files, settings.seed, feedback, chosen, rewards, live)
    result = trainer.run(stream, budget, on_progress)
    result.window = chosen.summary()
    result.warm_start = trainable.warm_start.summary()
    result.edit_examples = counts or None
    return result, held_out


def _train_kto(
    trainable: TrainableModel,
    settings: TrainSettings,
    feedback: FeedbackStore | None,
    window: TrainingWindow,
    rewards: dict[OutcomeKey, float],
    budget: Budget,
    work_dir: Path,
) -> TrainResult:
    """The window's feedback, one epoch (or the budget's samples), through trl's KTO."""
    from training.kto import run_kto

    if feedback is None or not window.new:
        raise ValueError("the kto objective trains on feedback, and the window holds none")
    examples = stream_feedback_examples(feedback, window, rewards, settings.seed)
    limit = budget.samples or len(window.epoch(settings.seed, 0))
    return run_kto(
        trainable.model,
        trainable.tokenizer,
        template_for(trainable.family),
        trainable.base_model_id,
        examples,
        settings,
        limit,
        work_dir,
        "cpu",
    )
