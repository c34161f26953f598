"""The trainer: LoRA on the completion model under a budget, with checkpoints that survive a kill.

The loop runs on HF accelerate (`accelerate.Accelerator`): the same code trains in one plain
process (a CPU or one GPU) and in several processes under `accelerate launch` or `torchrun`
(DDP; gloo on CPUs, NCCL on GPUs). One optimiser step sees `effective_batch` examples of the
run's example stream, whatever the number of processes: each process takes its share of them
(every `num_processes`-th), run as micro-batches of `micro_batch` examples (sized from free
memory unless fixed) with the gradients all-reduced once a step; an out-of-memory error halves
the micro-batch and runs the same examples again (`accelerate.utils.find_executable_batch_size`),
so the effective batch and the examples seen do not change. Every `checkpoint_every` steps the
LoRA weights and the optimiser's state (`torch.distributed.checkpoint`, which reshards), the
scheduler, the data position (examples of the stream consumed, counted over all processes) and
the random state are written, each file with its SHA-256; a run started again in the same
directory resumes from the newest checkpoint that verifies, on any number of processes and with
any micro-batch. The data stream is a pure function of the seed, so resuming skips exactly the
examples already trained on.

The objective (docs/learning.md): for code examples the mean negative log-likelihood of the
middle's tokens; for feedback examples a policy-gradient term, advantage times clipped inverse
propensity times the middle's mean log-likelihood (for a rejected suggestion held at a floor, so
it is pushed down only until it is unlikely); with `kl_weight` a KL anchor to a reference model
at the middle's positions (`training.objective`).

What makes a step cheaper (each a setting): the frozen base in bfloat16 (`base_dtype`), bfloat16
autocast (`autocast`: accelerate's bf16 mixed precision, refused on a GPU without bfloat16),
the LM head at the middle's positions only (`middle_only`), activation checkpointing
(`checkpointing`) and no LoRA dropout (`training.lora.LoraShape`); the micro-batch sizing follows
them (`bytes_per_example`).
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import itertools
import json
import logging
import math
import os
import resource
import shutil
import signal
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from common.machine import native_bfloat16
from common.memory import bound_primitive_cache
from completion.adapters import save_adapter
from completion.fim import FimTemplate
from training.budget import Budget
from training.edit_examples import EDIT_KIND, EDIT_TEMPLATE
from training.examples import FimExample
from training.lora import LoraShape
from training.memory import (
    available_memory_bytes,
    bytes_per_example,
    enable_checkpointing,
    size_micro_batch,
)
from training.objective import (
    REFERENCES,
    Reference,
    ReferenceModel,
    TokenBatch,
    kl_to_reference,
    middle_logits,
    pack,
    per_row_mean,
    token_logprobs,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
BaseDtype = Literal["float32", "bfloat16"]
BASE_DTYPES: tuple[BaseDtype, ...] = ("float32", "bfloat16")
Objective = Literal["fim", "kto"]
OBJECTIVES: tuple[Objective, ...] = ("fim", "kto")

KILL_AT_STEP_ENV = "TABLOOP_TRAIN_KILL_AT_STEP"
"""Fault injection for the resume test: the process SIGKILLs itself part-way into this step."""
OUT_OF_MEMORY_AT_ENV = "TABLOOP_TRAIN_OUT_OF_MEMORY_AT"
"""For tests: `RANK:N` makes process RANK run out of memory once (the CPU allocator's error),
before its N-th micro-batch of the run."""
EXAMPLES_LOG_ENV = "TABLOOP_TRAIN_EXAMPLES_LOG"
"""A file each process appends one JSON line to per optimiser step: the step, the stream
positions of the examples it trained on and its micro-batch (what the resume tests check)."""

CHECKPOINTS = "checkpoints"
FINAL_ADAPTER = "adapter"
CHECKPOINT_FORMAT = 2  # torch.distributed.checkpoint files plus `trainer.pt`
_TRAINER_STATE = "trainer.pt"  # the scheduler, the random state (the main process's)
_MANIFEST = "manifest.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from (corrupt, or made with other settings)."""


@dataclass(frozen=True)
class TrainSettings:
    """What decides the adapter a run produces (with the data and the base model)."""

    seed: int = 0
    learning_rate: float = 2e-4
    warmup_steps: int = 10
    effective_batch: int = 8
    # Examples a forward pass takes in each process (0: one on a CPU; on a GPU the most free
    # memory allows); halved on an out-of-memory error. Not part of a checkpoint's identity.
    micro_batch: int = 0
    max_prompt_tokens: int = 384
    max_middle_tokens: int = 64
    checkpoint_every: int = 20
    keep_checkpoints: int = 2
    pg_weight: float = 0.5
    logprob_floor: float = -5.0
    lora: LoraShape = field(default_factory=LoraShape)
    # The frozen base model's weights (the LoRA's stay float32) and bfloat16 autocast of the
    # forward pass. `auto` (None): bfloat16 and autocast where the CPU multiplies bfloat16
    # natively (2.6x the samples/s of float32 in half the memory), float32 elsewhere (where
    # bfloat16 ran 3.4x slower); decided when the settings are made (docs/learning.md).
    base_dtype: BaseDtype | Literal["auto"] = "auto"
    autocast: bool | None = None
    middle_only: bool = True  # the LM head only where a middle token is predicted
    # Activation checkpointing of every `checkpointing_every`-th decoder layer (the others keep
    # their activations): on, every second layer, by default. On every layer a full-length
    # example peaked at 2.8 GB and a step took a third longer than without; every second layer
    # halves both (docs/learning.md, `tabloop bench train`).
    checkpointing: bool = True
    checkpointing_every: int = 2
    kl_weight: float = 0.0  # the KL anchor's weight (0: none)
    kl_reference: Reference = "start"  # the adapter the run started from, or the base model
    objective: Objective = "fim"  # this trainer's loss, or trl's KTO on feedback (training.kto)
    # Next-edit examples: the weight of the middle's tokens that the edit changes (those not
    # copied from the window as it is) in the example's mean log-likelihood; the copied ones
    # weigh 1. A window is mostly copied, so at 1 the edit itself is a few tokens in hundreds.
    edit_token_weight: float = 1.0
    # Next-edit examples: the most tokens of the prompt, read verbatim (it has no suffix). 0: as
    # a completion's prefix, three quarters of `max_prompt_tokens`, which leaves out nearly every
    # real next-edit prompt (about 650 tokens at the median); `edit_train_settings` sets it for
    # a run that reads them.
    max_edit_prompt_tokens: int = 0

    def __post_init__(self) -> None:
        if self.base_dtype == "auto" or self.autocast is None:
            native = native_bfloat16()
            if self.base_dtype == "auto":
                object.__setattr__(self, "base_dtype", "bfloat16" if native else "float32")
            if self.autocast is None:
                object.__setattr__(self, "autocast", native)
        if self.base_dtype not in BASE_DTYPES:
            raise ValueError(f"base_dtype {self.base_dtype!r}: one of {', '.join(BASE_DTYPES)}")
        if self.kl_reference not in REFERENCES:
            raise ValueError(f"kl_reference {self.kl_reference!r}: one of {', '.join(REFERENCES)}")
        if self.kl_weight < 0:
            raise ValueError(f"kl_weight must be at least 0, not {self.kl_weight}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective {self.objective!r}: one of {', '.join(OBJECTIVES)}")
        if self.kl_weight > 0 and not self.middle_only:
            raise ValueError("the KL anchor needs middle_only (the head at the middle's positions)")
        if self.checkpointing_every < 1:
            raise ValueError(
                f"checkpointing_every must be at least 1, not {self.checkpointing_every}"
            )
        if not self.edit_token_weight > 0:
            raise ValueError(f"edit_token_weight must be above 0, not {self.edit_token_weight}")
        if self.max_edit_prompt_tokens < 0:
            raise ValueError(
                f"max_edit_prompt_tokens must be at least 0, not {self.max_edit_prompt_tokens}"
            )

    def identity(self) -> str:
        """What a checkpoint must have been made with to be resumed: what decides the maths of a
        step. The budget may change, and so may what only decides how a step is computed: the
        micro-batch, the number of processes, activation checkpointing (which recomputes the
        same values)."""
        fields = asdict(self)
        fields.pop("micro_batch")
        fields.pop("checkpoint_every")
        fields.pop("keep_checkpoints")
        fields.pop("checkpointing")
        fields.pop("checkpointing_every")
        if fields["edit_token_weight"] == 1.0:  # as checkpoints made before the setting
            fields.pop("edit_token_weight")
        if fields["max_edit_prompt_tokens"] == 0:  # likewise
            fields.pop("max_edit_prompt_tokens")
        return json.dumps(fields, sort_keys=True)

    @property
    def edit_prompt_tokens(self) -> int:
        """The most tokens of a next-edit example's prompt."""
        return self.max_edit_prompt_tokens or self.max_prompt_tokens * 3 // 4

    @property
    def longest_prompt_tokens(self) -> int:
        """The most tokens of any example's prompt (what a batch is sized for)."""
        return max(self.max_prompt_tokens, self.max_edit_prompt_tokens)

    @property
    def weights_dtype(self) -> BaseDtype:
        """`base_dtype` as decided (never `auto` once the settings are made)."""
        return "bfloat16" if self.base_dtype == "bfloat16" else "float32"

    @property
    def low_precision(self) -> bool:
        """Whether activations are mostly bfloat16 (a bfloat16 base or autocast)."""
        return self.base_dtype == "bfloat16" or bool(self.autocast)


@dataclass(frozen=True)
class Progress:
    step: int
    samples: int
    tokens: int
    loss: float
    samples_per_s: float
    elapsed_s: float
    fraction: float


@dataclass
class TrainResult:
    steps: int
    samples: int
    tokens: int
    elapsed_s: float
    samples_per_s: float
    seconds_per_1000_examples: float
    loss: float
    micro_batch: int
    accumulation: int
    device: str
    resumed_from_step: int
    refused_checkpoints: list[str]
    peak_rss_mb: float
    adapter: str
    stream_ended: bool
    processes: int = 1  # processes that trained (each its share of every step)
    # Examples of the stream consumed (counted over all processes; past those it could not
    # encode): a deterministic stream's first `position` items are what the run read.
    position: int = 0
    weights_sha256: str = ""  # this process's LoRA weights (`weights_digest`): equal on all
    mixed_precision: str = "no"  # accelerate's: "bf16" with autocast
    # Set by the caller that chose the data (`training.workspace`, `backend.adapters.run`): the
    # training window's counts and marks, and what the weights started from.
    window: dict[str, Any] | None = None
    warm_start: dict[str, Any] | None = None
    # The next-edit examples a workspace's run read (`training.workspace`, `training.edit_track`):
    # kept, dropped, held out.
    edit_examples: dict[str, Any] | None = None
    settings: dict[str, Any] | None = None  # the run's `TrainSettings`


@dataclass
class _Encoded:
    ids: list[int]
    prompt_len: int
    advantage: float
    weight: float
    feedback: bool
    token_weights: list[float] | None = None  # of the middle's tokens (None: all 1)


def changed_token_weights(
    draft_ids: Sequence[int], middle_ids: Sequence[int], weight: float
) -> list[float]:
    """`weight` for each token of `middle_ids` outside the longest runs it shares with
    `draft_ids` (what an edit writes), 1 for the tokens it copies."""
    weights = [weight] * len(middle_ids)
    matcher = difflib.SequenceMatcher(None, list(draft_ids), list(middle_ids), autojunk=False)
    for block in matcher.get_matching_blocks():
        weights[block.b : block.b + block.size] = [1.0] * block.size
    return weights


def encode(
    example: FimExample,
    tokenizer: Any,
    template: FimTemplate,
    max_prompt_tokens: int,
    max_middle_tokens: int,
    edit_token_weight: float = 1.0,
    edit_prompt_tokens: int = 0,
) -> _Encoded | None:
    """Token ids of the FIM prompt followed by the middle (and end of text when it fits). A
    next-edit example's prompt is its prefix as it is (`EDIT_TEMPLATE`), whatever `template`,
    its last `edit_prompt_tokens` (0: as a completion's prefix); with an `edit_token_weight`
    other than 1, the tokens of its middle that its draft does not have weigh that much."""
    prefix_budget = max_prompt_tokens * 3 // 4
    suffix_budget = max_prompt_tokens - prefix_budget
    if example.kind == EDIT_KIND:
        template = EDIT_TEMPLATE
        prefix_budget = edit_prompt_tokens or prefix_budget
    # Characters are cut first (a token is at least one character) so that a long file is never
    # tokenised whole for one example.
    prefix_ids = tokenizer.encode(example.prefix[-prefix_budget * 8 :], add_special_tokens=False)
    suffix_ids = tokenizer.encode(example.suffix[: suffix_budget * 8], add_special_tokens=False)
    prefix = tokenizer.decode(prefix_ids[-prefix_budget:]) if prefix_ids else ""
    suffix = tokenizer.decode(suffix_ids[:suffix_budget]) if suffix_ids else ""
    prompt_ids: list[int] = tokenizer(template.build(prefix, suffix, (), example.path))["input_ids"]
    middle_ids = tokenizer.encode(example.middle, add_special_tokens=False)
    if not middle_ids:
        return None
    middle_ids = middle_ids[:max_middle_tokens]
    token_weights = None
    if example.kind == EDIT_KIND and example.draft and edit_token_weight != 1.0:
        draft_ids = tokenizer.encode(example.draft, add_special_tokens=False)
        token_weights = changed_token_weights(draft_ids, middle_ids, edit_token_weight)
    if len(middle_ids) < max_middle_tokens and tokenizer.eos_token_id is not None:
        middle_ids = [*middle_ids, int(tokenizer.eos_token_id)]
        if token_weights is not None:
            token_weights.append(1.0)
    return _Encoded(
        prompt_ids + middle_ids,
        len(prompt_ids),
        example.advantage,
        example.weight,
        example.source == "feedback",
        token_weights,
    )


def mixed_stream(
    code: Iterator[T], feedback: Iterator[T] | None, feedback_share: float
) -> Iterator[T]:
    """Two streams interleaved in a fixed pattern, `feedback_share` of the items from the second
    while there is any (code and feedback examples; new and replayed outcomes); when one ends
    the other goes on."""
    code_done = False
    feedback_done = feedback is None
    for k in itertools.count():
        want_feedback = int((k + 1) * feedback_share) > int(k * feedback_share)
        order = [feedback, code] if want_feedback else [code, feedback]
        produced = False
        for source in order:
            if source is None or (source is code and code_done):
                continue
            if source is feedback and feedback_done:
                continue
            item = next(source, None)
            if item is None:
                if source is code:
                    code_done = True
                else:
                    feedback_done = True
                continue
            produced = True
            yield item
            break
        if not produced:
            return


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def weights_digest(model: Any) -> str:
    """SHA-256 of a model's trainable weights in name order (processes that agree have the
    same)."""
    digest = hashlib.sha256()
    for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
        if param.requires_grad:
            digest.update(name.encode())
            digest.update(param.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def mixed_precision_for(device: str, autocast: bool) -> str:
    """accelerate's mixed precision for `autocast` on `device`: "bf16" where the device computes
    in bfloat16 (a CPU, a GPU that supports it), "no" without autocast; ValueError otherwise."""
    import torch

    if not autocast:
        return "no"
    if device.startswith("cuda") and not torch.cuda.is_bf16_supported():
        raise ValueError("autocast needs bfloat16, which this GPU does not support")
    return "bf16"


def _accelerator(device: str, mixed_precision: str) -> Any:
    """An `accelerate.Accelerator` for this run: DDP without broadcasting buffers at each
    forward pass (the processes may run different numbers of micro-batches), and the scheduler
    stepped once per optimiser step (not once per process)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedDataParallelKwargs

    if PartialState._shared_state and PartialState().num_processes == 1:
        # A plain process (the language server, the tests) trains one run after another, each
        # with its own device and precision; accelerate keeps one state per process.
        AcceleratorState._reset_state(reset_partial_state=True)
    return Accelerator(
        cpu=device.startswith("cpu"),
        mixed_precision=mixed_precision,
        step_scheduler_with_optimizer=False,
        kwargs_handlers=[DistributedDataParallelKwargs(broadcast_buffers=False)],
    )


def _forward_module(model: Any) -> Any:
    """The model's forward pass as the objective needs it, as one module, so that DDP (which
    syncs the gradients of what runs through its `forward`) sees it: the logits at the middle's
    positions (`middle_only`) or the model's output over the batch's last `kept` positions."""
    import torch

    class ObjectiveForward(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, packed: TokenBatch, device: str, kept: int) -> Any:
            if kept == 0:
                return middle_logits(self.model, packed, device)
            return self.model(
                input_ids=packed.ids.to(device),
                attention_mask=packed.mask.to(device),
                position_ids=packed.positions.to(device),
                logits_to_keep=kept,
                use_cache=False,
            ).logits

    return ObjectiveForward()


@dataclass
class _Step:
    """One optimiser step's examples: their stream positions and encodings (all processes')."""

    positions: list[int]
    encoded: list[_Encoded]

    def share(self, rank: int, processes: int) -> list[tuple[int, _Encoded]]:
        return list(zip(self.positions, self.encoded, strict=True))[rank::processes]


class Trainer:
    """Trains a LoRA adapter on a peft-wrapped model in `work_dir` (checkpoints, final adapter).

    Under `accelerate launch`/`torchrun` every process builds its own `Trainer` on the same
    model, settings and `work_dir` (a directory all of them see); the main process writes the
    adapter."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        template: FimTemplate,
        base_model_id: str,
        settings: TrainSettings,
        work_dir: Path,
        device: str | None = None,
    ) -> None:
        bound_primitive_cache()  # before the first step's matrix products
        import torch

        self.model = model
        self.tokenizer = tokenizer
        self.template = template
        self.base_model_id = base_model_id
        self.settings = settings
        self.work_dir = work_dir
        wanted = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.mixed_precision = mixed_precision_for(wanted, bool(settings.autocast))
        self.accelerator = _accelerator(wanted, self.mixed_precision)
        placed = self.accelerator.device
        self.device = "cpu" if placed.type == "cpu" else str(placed)
        self.processes = int(self.accelerator.num_processes)
        self.rank = int(self.accelerator.process_index)
        # Each process's share of a step (the first processes take one more when it does not
        # divide).
        self.share = math.ceil(settings.effective_batch / self.processes)
        sequence = settings.longest_prompt_tokens + settings.max_middle_tokens + 8
        sized = settings.micro_batch or size_micro_batch(
            self.share,
            self.device,
            available_memory_bytes(self.device),
            bytes_per_example(
                model.config,
                sequence,
                settings.max_middle_tokens + 1,
                element_bytes=3 if settings.low_precision else 4,
                checkpointing=settings.checkpointing,
                checkpointing_every=settings.checkpointing_every,
                kl=settings.kl_weight > 0,
            ),
        )
        self.micro_batch = max(1, min(sized, self.share))
        self._pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        if settings.checkpointing:
            enable_checkpointing(model, settings.checkpointing_every)
        self.model.to(self.device)
        # Made before any checkpoint is loaded: the weights the run started from.
        self.reference = (
            ReferenceModel(model, settings.kl_reference) if settings.kl_weight > 0 else None
        )
        self._params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(self._params, lr=settings.learning_rate, weight_decay=0.0)
        warmup = max(1, settings.warmup_steps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / warmup)
        )
        self._optimizer = optimizer  # the torch objects, for checkpoints
        self._scheduler = scheduler
        self.forward, self.optimizer, self.scheduler = self.accelerator.prepare(
            _forward_module(model), optimizer, scheduler
        )
        self.before_micro_batch: Callable[[int], None] | None = None
        """Called with each micro-batch's size before its forward pass (fault injection)."""

    @property
    def accumulation(self) -> int:
        """Micro-batches a process runs per optimiser step at the current micro-batch."""
        return math.ceil(self.share / self.micro_batch)

    # --- checkpoints ---

    def _state_dicts(self) -> dict[str, Any]:
        """The LoRA weights and the optimiser's state, as `torch.distributed.checkpoint` saves
        and loads them (keyed by parameter name, whatever wraps the model)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        weights, optimizer = get_state_dict(self.model, self._optimizer, options=_OPTIONS())
        return {"weights": weights, "optimizer": optimizer}

    def _save_checkpoint(
        self, step: int, position: int, samples: int, tokens: int, elapsed: float, loss: float
    ) -> None:
        import random

        import torch
        import torch.distributed.checkpoint as dcp

        root = self.work_dir / CHECKPOINTS
        target = root / f"step-{step:08d}"
        work = root / f".{target.name}.partial"
        main = self.accelerator.is_main_process
        if main:
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
        self.accelerator.wait_for_everyone()
        with _single_process_quiet():
            dcp.save(self._state_dicts(), checkpoint_id=work)
        if main:
            torch.save(
                {
                    "scheduler": self._scheduler.state_dict(),
                    "torch_rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                    "python_rng": random.getstate(),
                },
                work / _TRAINER_STATE,
            )
            with (work / _TRAINER_STATE).open("rb") as handle:
                os.fsync(handle.fileno())
            manifest = {
                "format": CHECKPOINT_FORMAT,
                "step": step,
                "position": position,
                "samples": samples,
                "tokens": tokens,
                "elapsed_s": elapsed,
                "loss": loss,
                "base_model": self.base_model_id,
                "identity": self.settings.identity(),
                "processes": self.processes,
                "micro_batch": self.micro_batch,
                "sha256": {
                    f.name: _sha256(f) for f in sorted(work.iterdir()) if f.name != _MANIFEST
                },
            }
            (work / _MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            if target.exists():  # a refused checkpoint of this step, from before a resume
                shutil.rmtree(target)
            os.rename(work, target)
            kept = sorted(root.glob("step-*"))
            for old in kept[: -self.settings.keep_checkpoints]:
                shutil.rmtree(old, ignore_errors=True)
        self.accelerator.wait_for_everyone()

    def _verified_manifest(self, directory: Path) -> dict[str, Any]:
        """The manifest of the checkpoint in `directory` once its identity and every file's
        SHA-256 match (CheckpointError otherwise)."""
        try:
            manifest = json.loads((directory / _MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{directory}: unreadable manifest ({exc})") from None
        if manifest.get("base_model") != self.base_model_id:
            raise CheckpointError(f"{directory}: made on {manifest.get('base_model')}")
        if manifest.get("identity") != self.settings.identity():
            raise CheckpointError(
                f"{directory}: made with other settings (seed, batch, LoRA shape...); "
                "resume with the same settings or start in a new directory"
            )
        digests = manifest.get("sha256")
        if manifest.get("format") != CHECKPOINT_FORMAT or not isinstance(digests, dict):
            raise CheckpointError(f"{directory}: made by an older trainer (another format)")
        for name, digest in digests.items():
            path = directory / name
            if not path.is_file() or _sha256(path) != digest:
                raise CheckpointError(f"{directory}: {name} does not match its checksum")
        return dict(manifest)

    def _load_checkpoint(self, directory: Path) -> dict[str, Any]:
        import random

        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        manifest = self._verified_manifest(directory)
        state = self._state_dicts()
        try:
            with _single_process_quiet():
                dcp.load(state, checkpoint_id=directory)
            extra = torch.load(directory / _TRAINER_STATE, map_location="cpu", weights_only=False)
        except Exception as exc:  # a checkpoint of another adapter, or damaged past the hash
            raise CheckpointError(f"{directory}: its state does not fit this run ({exc})") from None
        set_state_dict(
            self.model,
            self._optimizer,
            model_state_dict=state["weights"],
            optim_state_dict=state["optimizer"],
            options=_OPTIONS(),
        )
        self._scheduler.load_state_dict(extra["scheduler"])
        torch.set_rng_state(extra["torch_rng"])
        if extra["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(extra["cuda_rng"])
        random.setstate(extra["python_rng"])
        return manifest

    def _resume(self) -> tuple[dict[str, Any] | None, list[str]]:
        refused: list[str] = []
        root = self.work_dir / CHECKPOINTS
        for directory in sorted(root.glob("step-*"), reverse=True) if root.is_dir() else []:
            try:
                return self._load_checkpoint(directory), refused
            except CheckpointError as exc:
                log.warning("not resuming from a checkpoint: %s", exc)
                refused.append(str(exc))
        return None, refused

    # --- steps ---

    def _mean_logprobs(self, batch: list[_Encoded]) -> tuple[Any, Any]:
        """([batch] each middle's mean token log-likelihood, [batch] its KL to the reference or
        None), with the LM head at the middle's positions only (`middle_only`) or, as before,
        at the last positions of the batch (as many as its longest middle has)."""

        packed = pack(
            [(e.ids, e.prompt_len) for e in batch],
            self._pad,
            [e.token_weights for e in batch],
        )
        if not self.settings.middle_only:
            return self._mean_logprobs_last_positions(packed), None
        with self.accelerator.autocast():
            # The reference first: taking the start weights swaps them in and back in place,
            # which must not happen between the forward pass and its backward.
            reference = (
                self.reference.logits(packed, self.device) if self.reference is not None else None
            )
            logits = self.forward(packed, self.device, 0)
        picked, logprobs = token_logprobs(logits, packed, full=reference is not None)
        kl = kl_to_reference(logprobs, reference, packed) if reference is not None else None
        return per_row_mean(picked, packed, packed.weights), kl

    def _mean_logprobs_last_positions(self, packed: TokenBatch) -> Any:
        """The loss as first built: `logits_to_keep` over the batch's last positions."""
        import torch

        kept = int(packed.counts.max()) + 1
        longest = packed.ids.shape[1]
        with self.accelerator.autocast():
            logits = self.forward(packed, self.device, kept)
        logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        columns = packed.columns.to(self.device) - (longest - kept)
        picked = logprobs[packed.rows.to(self.device), columns, packed.targets.to(self.device)]
        return per_row_mean(picked, packed, packed.weights)

    def _micro_loss(self, batch: list[_Encoded], scale: float | None = None) -> tuple[Any, float]:
        """Sum over the micro-batch of each example's loss times `scale` (None: divided by the
        effective batch, as in one process), and the sum of its examples' negative
        log-likelihoods."""
        import torch

        if scale is None:
            scale = 1 / self.settings.effective_batch

        mean_logprob, kl = self._mean_logprobs(batch)
        losses = []
        for row, example in enumerate(batch):
            if example.feedback:
                coefficient = self.settings.pg_weight * example.advantage * example.weight
                # The floor bounds only the push down on a rejected suggestion; an accepted one
                # is pulled up however unlikely it is now (as a supervised example is).
                logprob = (
                    torch.clamp(mean_logprob[row], min=self.settings.logprob_floor)
                    if coefficient < 0
                    else mean_logprob[row]
                )
                losses.append(-coefficient * logprob)
            else:
                losses.append(-mean_logprob[row])
        total = torch.stack(losses).sum()
        if kl is not None:
            total = total + self.settings.kl_weight * kl.sum()
        return total * scale, float(-mean_logprob.detach().sum())

    def _accumulate(
        self,
        micro_batch: int,
        share: list[tuple[int, _Encoded]],
        filler: _Encoded,
        step: int,
        kill_at: int,
    ) -> tuple[float, int]:
        """This process's share of a step as micro-batches of `micro_batch`, gradients
        accumulated (synced across processes on the last); (summed NLL, tokens). A process
        with no share (a short last step) runs `filler` at weight 0, as DDP needs every
        process's backward pass."""
        examples = [encoded for _, encoded in share]
        # DDP averages the processes' gradients: each process's sum is scaled so that the
        # average is the sum over the whole step divided by the effective batch.
        scale = self.processes / self.settings.effective_batch
        if not examples:
            examples, scale = [filler], 0.0
        chunks = [examples[k : k + micro_batch] for k in range(0, len(examples), micro_batch)]
        self.optimizer.zero_grad(set_to_none=True)
        alone = self.processes == 1
        nll = 0.0
        try:
            for k, chunk in enumerate(chunks):
                if self.before_micro_batch is not None:
                    self.before_micro_batch(len(chunk))
                # One process needs no sync. Several accumulate on their own and sync after
                # all got through (`_sync_gradients`): never inside a backward pass, which may
                # run out of memory on one process while the others wait in its all-reduce.
                synced = alone and k == len(chunks) - 1
                with contextlib.nullcontext() if synced else self.accelerator.no_sync(self.forward):
                    loss, chunk_nll = self._micro_loss(chunk, scale)
                    self.accelerator.backward(loss)
                if kill_at and step + 1 == kill_at and k == 0:
                    os.kill(os.getpid(), signal.SIGKILL)
                nll += chunk_nll if scale else 0.0
        except Exception as exc:
            from accelerate.utils.memory import should_reduce_batch_size

            if alone or not should_reduce_batch_size(exc):
                raise
            self._sync_gradients(ran_out=True)  # the others learn it and halve too
            raise
        if not alone:
            self._sync_gradients(ran_out=False)
        self.micro_batch = micro_batch
        return nll, sum(len(e.ids) for _, e in share)

    def _sync_gradients(self, *, ran_out: bool) -> None:
        """With several processes, after each accumulated its share: first all agree whether
        one ran out of memory (then every process raises an out-of-memory error, so that each
        halves its micro-batch and redoes the step), else the gradients are averaged, as DDP's
        own sync would have done, in one all-reduce of the trainable weights' gradients."""
        import torch

        flag = torch.tensor([1.0 if ran_out else 0.0], device=self.device)
        if float(self.accelerator.reduce(flag, reduction="sum").item()) > 0:
            self.optimizer.zero_grad(set_to_none=True)
            if ran_out:
                return  # the caller raises its own error
            # accelerate's `should_reduce_batch_size` knows the error by " out of memory.".
            raise RuntimeError("another process of this training run ran out of memory.")
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self._params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        averaged = self.accelerator.reduce(flat, reduction="mean")
        offset = 0
        for param, grad in zip(self._params, grads, strict=True):
            size = grad.numel()
            param.grad = averaged[offset : offset + size].view_as(grad).clone()
            offset += size

    def _read_step(
        self, examples: Iterator[tuple[int, FimExample]], position: int
    ) -> tuple[_Step, int, bool]:
        """The next `effective_batch` examples that encode (every process reads and encodes
        the same ones), the stream position after them, and whether the stream ended."""
        step = _Step([], [])
        while len(step.encoded) < self.settings.effective_batch:
            item = next(examples, None)
            if item is None:
                return step, position, True
            index, example = item
            position = index + 1
            encoded = encode(
                example,
                self.tokenizer,
                self.template,
                self.settings.max_prompt_tokens,
                self.settings.max_middle_tokens,
                self.settings.edit_token_weight,
                self.settings.edit_prompt_tokens,
            )
            if encoded is not None:
                step.positions.append(index)
                step.encoded.append(encoded)
        return step, position, False

    def run(
        self,
        stream: Callable[[], Iterator[FimExample]],
        budget: Budget,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> TrainResult:
        """Train until `budget` is spent (or the stream ends), resuming from a checkpoint in
        `work_dir` when there is one, and write the adapter to `work_dir/adapter` (the main
        process)."""
        import torch
        from accelerate.utils import find_executable_batch_size

        manifest, refused = self._resume()
        step = int(manifest["step"]) if manifest else 0
        position = int(manifest["position"]) if manifest else 0
        samples = int(manifest["samples"]) if manifest else 0
        tokens = int(manifest["tokens"]) if manifest else 0
        elapsed_before = float(manifest["elapsed_s"]) if manifest else 0.0
        loss_avg = float(manifest["loss"]) if manifest else 0.0
        resumed_from = step
        if manifest is None:
            torch.manual_seed(self.settings.seed)
        # The stream is deterministic: skip what was trained on (counted over all processes).
        examples = enumerate(stream())
        for _ in range(position):
            if next(examples, None) is None:
                break
        accumulate = find_executable_batch_size(
            self._accumulate,
            starting_batch_size=self.micro_batch,
            reduce_batch_size_fn=self._halve_micro_batch,
        )
        kill_at = int(os.environ.get(KILL_AT_STEP_ENV, "0") or 0)
        if self.before_micro_batch is None and os.environ.get(OUT_OF_MEMORY_AT_ENV):
            self.before_micro_batch = _out_of_memory_at(os.environ[OUT_OF_MEMORY_AT_ENV], self.rank)
        examples_log = os.environ.get(EXAMPLES_LOG_ENV)
        started = time.perf_counter()
        samples_at_start = samples
        ended = False
        self.forward.train()
        while not budget.reached(samples, tokens, elapsed_before + time.perf_counter() - started):
            batch, position, ended = self._read_step(examples, position)
            if not batch.encoded:
                break
            share = batch.share(self.rank, self.processes)
            nll, local_tokens = accumulate(share, batch.encoded[-1], step, kill_at)
            self.accelerator.clip_grad_norm_(self._params, 1.0)
            self.optimizer.step()
            self.scheduler.step()
            step += 1
            totals = self.accelerator.reduce(
                torch.tensor([nll, float(local_tokens)], device=self.device), reduction="sum"
            )
            step_loss, step_tokens = (float(v) for v in totals.tolist())
            step_samples = len(batch.encoded)
            samples += step_samples
            tokens += int(step_tokens)
            if examples_log:
                _log_examples(Path(examples_log), self.rank, step, share, self.micro_batch)
            loss_avg = (
                step_loss / step_samples
                if step == 1
                else 0.9 * loss_avg + 0.1 * (step_loss / step_samples)
            )
            elapsed = elapsed_before + time.perf_counter() - started
            if on_progress is not None and self.accelerator.is_main_process:
                rate = (samples - samples_at_start) / max(time.perf_counter() - started, 1e-9)
                on_progress(
                    Progress(
                        step,
                        samples,
                        tokens,
                        loss_avg,
                        rate,
                        elapsed,
                        budget.fraction(samples, tokens, elapsed),
                    )
                )
            if step % self.settings.checkpoint_every == 0:
                self._save_checkpoint(step, position, samples, tokens, elapsed, loss_avg)
            if ended:
                break
        self.forward.eval()
        run_s = time.perf_counter() - started
        elapsed = elapsed_before + run_s
        adapter = self.work_dir / FINAL_ADAPTER
        if self.accelerator.is_main_process:
            save_adapter(
                self.model,
                adapter,
                self.base_model_id,
                {"steps": step, "samples": samples, "tokens": tokens, "seed": self.settings.seed},
            )
        self.accelerator.wait_for_everyone()
        rate = (samples - samples_at_start) / run_s if run_s > 0 else 0.0
        return TrainResult(
            steps=step,
            samples=samples,
            tokens=tokens,
            elapsed_s=round(elapsed, 2),
            samples_per_s=round(rate, 3),
            seconds_per_1000_examples=round(1000 / rate, 1) if rate else 0.0,
            loss=round(loss_avg, 4),
            micro_batch=self.micro_batch,
            accumulation=self.accumulation,
            device=self.device,
            resumed_from_step=resumed_from,
            refused_checkpoints=refused,
            peak_rss_mb=round(_peak_rss_mb(), 1),
            adapter=str(adapter),
            stream_ended=ended,
            processes=self.processes,
            position=position,
            weights_sha256=weights_digest(self.model),
            mixed_precision=self.mixed_precision,
            settings=asdict(self.settings),
        )

    def _halve_micro_batch(self) -> int:
        """The micro-batch after an out-of-memory error: half (0 when one example did not fit,
        which ends the run with accelerate's error)."""
        self.micro_batch //= 2
        log.warning(
            "out of memory: the micro-batch is now %d (%d a step)",
            self.micro_batch,
            self.accumulation if self.micro_batch else 0,
        )
        return self.micro_batch


def _out_of_memory_at(spec: str, rank: int) -> Callable[[int], None] | None:
    """The fault `OUT_OF_MEMORY_AT_ENV` asks for, for process `rank` (None: not this one)."""
    at_rank, _, at_call = spec.partition(":")
    if int(at_rank) != rank:
        return None
    calls = 0

    def before_micro_batch(size: int) -> None:
        nonlocal calls
        calls += 1
        if calls == int(at_call):
            raise RuntimeError(f"DefaultCPUAllocator: can't allocate memory: injected ({spec})")

    return before_micro_batch


def _OPTIONS() -> Any:
    """State-dict options of the checkpoints: the trainable (LoRA) weights only."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(ignore_frozen_params=True, strict=False)


@contextlib.contextmanager
def _single_process_quiet() -> Iterator[None]:
    """torch.distributed.checkpoint in a plain process (no process group) warns that it
    assumes one process, which is what is meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _log_examples(
    path: Path, rank: int, step: int, share: Sequence[tuple[int, _Encoded]], micro_batch: int
) -> None:
    line = {
        "rank": rank,
        "step": step,
        "positions": [p for p, _ in share],
        "micro_batch": micro_batch,
    }
    with path.open("a") as handle:
        handle.write(json.dumps(line) + "\n")
