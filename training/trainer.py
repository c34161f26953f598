"""The trainer: LoRA on the completion model under a budget, with checkpoints that survive a kill.

One optimiser step sees `effective_batch` examples, run as `accumulation` micro-batches of
`micro_batch` examples (sized from free memory unless fixed). Every `checkpoint_every` steps the
LoRA weights, the optimiser, the scheduler, the stream position and the random state are written
atomically; a run started again in the same directory resumes from the newest checkpoint that
verifies. With the micro-batch fixed, a run killed at any point and resumed ends with the same
adapter as a run never interrupted (the data stream is a pure function of the seed, so resuming
skips exactly the examples already seen).

The objective (docs/learning.md): for code examples the mean negative log-likelihood of the
middle's tokens; for feedback examples a policy-gradient term, advantage times clipped inverse
propensity times the middle's mean log-likelihood (for a rejected suggestion held at a floor, so
it is pushed down only until it is unlikely); with `kl_weight` a KL anchor to a reference model
at the middle's positions (`training.objective`).

What makes a step cheaper (each a setting): the frozen base in bfloat16 (`base_dtype`), bfloat16
autocast (`autocast`), the LM head at the middle's positions only (`middle_only`) and activation
checkpointing (`checkpointing`); the micro-batch sizing follows them (`bytes_per_example`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import resource
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from completion.adapters import save_adapter
from completion.fim import FimTemplate
from training.budget import Budget
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

CHECKPOINTS = "checkpoints"
FINAL_ADAPTER = "adapter"
_STATE = "state.pt"
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
    micro_batch: int = 0  # 0: one on a CPU; on a GPU the largest free memory allows (a divisor)
    max_prompt_tokens: int = 384
    max_middle_tokens: int = 64
    checkpoint_every: int = 20
    keep_checkpoints: int = 2
    pg_weight: float = 0.5
    logprob_floor: float = -5.0
    lora: LoraShape = field(default_factory=LoraShape)
    # bfloat16 weights and autocast: off by default, bfloat16 matrix products measured 3.4x
    # slower than float32 on a CPU without native bfloat16 (AVX2); see docs/learning.md.
    base_dtype: BaseDtype = "float32"  # the frozen base model's weights (the LoRA's: float32)
    autocast: bool = False  # bfloat16 autocast of the forward pass
    middle_only: bool = True  # the LM head only where a middle token is predicted
    # Activation checkpointing of the decoder layers: off by default, it halved samples/s on a
    # CPU for a fifth less memory (docs/learning.md).
    checkpointing: bool = False
    kl_weight: float = 0.0  # the KL anchor's weight (0: none)
    kl_reference: Reference = "start"  # the adapter the run started from, or the base model
    objective: Objective = "fim"  # this trainer's loss, or trl's KTO on feedback (training.kto)

    def __post_init__(self) -> None:
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

    def identity(self, micro_batch: int) -> str:
        """What a checkpoint must have been made with to be resumed (the budget may change, and
        so may activation checkpointing, which recomputes the same values)."""
        fields = asdict(self)
        fields["micro_batch"] = micro_batch
        fields.pop("checkpoint_every")
        fields.pop("keep_checkpoints")
        fields.pop("checkpointing")
        return json.dumps(fields, sort_keys=True)

    @property
    def low_precision(self) -> bool:
        """Whether activations are mostly bfloat16 (a bfloat16 base or autocast)."""
        return self.base_dtype == "bfloat16" or self.autocast


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
    # Set by the caller that chose the data (`training.workspace`, `backend.adapters.run`): the
    # training window's counts and marks, and what the weights started from.
    window: dict[str, Any] | None = None
    warm_start: dict[str, Any] | None = None
    settings: dict[str, Any] | None = None  # the run's `TrainSettings`


@dataclass
class _Encoded:
    ids: list[int]
    prompt_len: int
    advantage: float
    weight: float
    feedback: bool


def encode(
    example: FimExample,
    tokenizer: Any,
    template: FimTemplate,
    max_prompt_tokens: int,
    max_middle_tokens: int,
) -> _Encoded | None:
    """Token ids of the FIM prompt followed by the middle (and end of text when it fits)."""
    prefix_budget = max_prompt_tokens * 3 // 4
    suffix_budget = max_prompt_tokens - prefix_budget
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
    if len(middle_ids) >= max_middle_tokens:
        middle_ids = middle_ids[:max_middle_tokens]
    elif tokenizer.eos_token_id is not None:
        middle_ids = [*middle_ids, int(tokenizer.eos_token_id)]
    return _Encoded(
        prompt_ids + middle_ids,
        len(prompt_ids),
        example.advantage,
        example.weight,
        example.source == "feedback",
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


class Trainer:
    """Trains a LoRA adapter on a peft-wrapped model in `work_dir` (checkpoints, final adapter)."""

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
        import torch

        self.model = model
        self.tokenizer = tokenizer
        self.template = template
        self.base_model_id = base_model_id
        self.settings = settings
        self.work_dir = work_dir
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model.to(self.device)
        sequence = settings.max_prompt_tokens + settings.max_middle_tokens + 8
        self.micro_batch = settings.micro_batch or size_micro_batch(
            settings.effective_batch,
            self.device,
            available_memory_bytes(self.device),
            bytes_per_example(
                model.config,
                sequence,
                settings.max_middle_tokens + 1,
                element_bytes=3 if settings.low_precision else 4,
                checkpointing=settings.checkpointing,
                kl=settings.kl_weight > 0,
            ),
        )
        if settings.effective_batch % self.micro_batch:
            raise ValueError(
                f"micro_batch {self.micro_batch} does not divide effective_batch "
                f"{settings.effective_batch}"
            )
        self.accumulation = settings.effective_batch // self.micro_batch
        self._params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            self._params, lr=settings.learning_rate, weight_decay=0.0
        )
        warmup = max(1, settings.warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup)
        )
        self._pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        if settings.checkpointing:
            enable_checkpointing(model)
        # Made before any checkpoint is loaded: the weights the run started from.
        self.reference = (
            ReferenceModel(model, settings.kl_reference) if settings.kl_weight > 0 else None
        )

    # --- checkpoints ---

    def _trainable_state(self) -> dict[str, Any]:
        return {
            name: p.detach().cpu().clone()
            for name, p in self.model.named_parameters()
            if p.requires_grad
        }

    def _save_checkpoint(
        self, step: int, position: int, samples: int, tokens: int, elapsed: float, loss: float
    ) -> None:
        import random

        import torch

        root = self.work_dir / CHECKPOINTS
        root.mkdir(parents=True, exist_ok=True)
        target = root / f"step-{step:08d}"
        work = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=root))
        try:
            state = {
                "weights": self._trainable_state(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                "python_rng": random.getstate(),
            }
            torch.save(state, work / _STATE)
            with (work / _STATE).open("rb") as handle:
                os.fsync(handle.fileno())
            manifest = {
                "step": step,
                "position": position,
                "samples": samples,
                "tokens": tokens,
                "elapsed_s": elapsed,
                "loss": loss,
                "base_model": self.base_model_id,
                "identity": self.settings.identity(self.micro_batch),
                "sha256": _sha256(work / _STATE),
            }
            (work / _MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
            if target.exists():  # a refused checkpoint of this step, from before a resume
                shutil.rmtree(target)
            os.rename(work, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        kept = sorted(root.glob("step-*"))
        for old in kept[: -self.settings.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)

    def _load_checkpoint(self, directory: Path) -> dict[str, Any]:
        import random

        import torch

        try:
            manifest = json.loads((directory / _MANIFEST).read_text())
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{directory}: unreadable manifest ({exc})") from None
        if manifest.get("base_model") != self.base_model_id:
            raise CheckpointError(f"{directory}: made on {manifest.get('base_model')}")
        if manifest.get("identity") != self.settings.identity(self.micro_batch):
            raise CheckpointError(
                f"{directory}: made with other settings (seed, batch, LoRA shape...); "
                "resume with the same settings or start in a new directory"
            )
        path = directory / _STATE
        if not path.is_file() or _sha256(path) != manifest.get("sha256"):
            raise CheckpointError(f"{directory}: {_STATE} does not match its checksum")
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc:  # torch raises many kinds for a damaged file
            raise CheckpointError(f"{directory}: unreadable state ({exc})") from None
        names = {n for n, p in self.model.named_parameters() if p.requires_grad}
        if set(state["weights"]) != names:
            raise CheckpointError(f"{directory}: its weights do not fit this adapter")
        with torch.no_grad():
            for name, p in self.model.named_parameters():
                if p.requires_grad:
                    p.copy_(state["weights"][name].to(p.device))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["torch_rng"])
        if state["cuda_rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        random.setstate(state["python_rng"])
        return dict(manifest)

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

    def _autocast(self) -> Any:
        import contextlib

        import torch

        if not self.settings.autocast:
            return contextlib.nullcontext()
        return torch.autocast(self.device.split(":")[0], dtype=torch.bfloat16)

    def _mean_logprobs(self, batch: list[_Encoded]) -> tuple[Any, Any]:
        """([batch] each middle's mean token log-likelihood, [batch] its KL to the reference or
        None), with the LM head at the middle's positions only (`middle_only`) or, as before,
        at the last positions of the batch (as many as its longest middle has)."""

        packed = pack([(e.ids, e.prompt_len) for e in batch], self._pad)
        if not self.settings.middle_only:
            return self._mean_logprobs_last_positions(packed), None
        with self._autocast():
            # The reference first: taking the start weights swaps them in and back in place,
            # which must not happen between the forward pass and its backward.
            reference = (
                self.reference.logits(packed, self.device) if self.reference is not None else None
            )
            logits = middle_logits(self.model, packed, self.device)
        picked, logprobs = token_logprobs(logits, packed, full=reference is not None)
        kl = kl_to_reference(logprobs, reference, packed) if reference is not None else None
        return per_row_mean(picked, packed), kl

    def _mean_logprobs_last_positions(self, packed: TokenBatch) -> Any:
        """The loss as first built: `logits_to_keep` over the batch's last positions."""
        import torch

        kept = int(packed.counts.max()) + 1
        longest = packed.ids.shape[1]
        with self._autocast():
            out = self.model(
                input_ids=packed.ids.to(self.device),
                attention_mask=packed.mask.to(self.device),
                position_ids=packed.positions.to(self.device),
                logits_to_keep=kept,
                use_cache=False,
            )
        logprobs = torch.log_softmax(out.logits[:, :-1].float(), dim=-1)
        columns = packed.columns.to(self.device) - (longest - kept)
        picked = logprobs[packed.rows.to(self.device), columns, packed.targets.to(self.device)]
        return per_row_mean(picked, packed)

    def _micro_loss(self, batch: list[_Encoded]) -> tuple[Any, float]:
        """Sum over the micro-batch of each example's loss, divided by the effective batch."""
        import torch

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
        return total / self.settings.effective_batch, float(-mean_logprob.detach().mean())

    def run(
        self,
        stream: Callable[[], Iterator[FimExample]],
        budget: Budget,
        on_progress: Callable[[Progress], None] | None = None,
    ) -> TrainResult:
        """Train until `budget` is spent (or the stream ends), resuming from a checkpoint in
        `work_dir` when there is one, and write the adapter to `work_dir/adapter`."""
        import torch

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
        examples = stream()
        for _ in range(position):  # the stream is deterministic: skip what was trained on
            if next(examples, None) is None:
                break
        kill_at = int(os.environ.get(KILL_AT_STEP_ENV, "0") or 0)
        started = time.perf_counter()
        samples_at_start = samples
        ended = False
        self.model.train()
        while not budget.reached(samples, tokens, elapsed_before + time.perf_counter() - started):
            self.optimizer.zero_grad(set_to_none=True)
            step_loss = 0.0
            step_samples = 0
            for micro in range(self.accumulation):
                batch: list[_Encoded] = []
                while len(batch) < self.micro_batch:
                    example = next(examples, None)
                    if example is None:
                        ended = True
                        break
                    position += 1
                    encoded = encode(
                        example,
                        self.tokenizer,
                        self.template,
                        self.settings.max_prompt_tokens,
                        self.settings.max_middle_tokens,
                    )
                    if encoded is not None:
                        batch.append(encoded)
                if not batch:
                    break
                loss, nll = self._micro_loss(batch)
                loss.backward()
                if kill_at and step + 1 == kill_at and micro == 0:
                    os.kill(os.getpid(), signal.SIGKILL)
                step_loss += nll * len(batch)
                step_samples += len(batch)
                tokens += sum(len(e.ids) for e in batch)
            if step_samples == 0:
                break
            torch.nn.utils.clip_grad_norm_(self._params, 1.0)
            self.optimizer.step()
            self.scheduler.step()
            step += 1
            samples += step_samples
            loss_avg = (
                step_loss / step_samples
                if step == 1
                else 0.9 * loss_avg + 0.1 * (step_loss / step_samples)
            )
            elapsed = elapsed_before + time.perf_counter() - started
            if on_progress is not None:
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
        self.model.eval()
        run_s = time.perf_counter() - started
        elapsed = elapsed_before + run_s
        adapter = self.work_dir / FINAL_ADAPTER
        save_adapter(
            self.model,
            adapter,
            self.base_model_id,
            {"steps": step, "samples": samples, "tokens": tokens, "seed": self.settings.seed},
        )
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
            settings=asdict(self.settings),
        )
