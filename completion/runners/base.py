"""The runner contract: what every model runner implements, and what some of them add.

`ModelRunner` is what every runner (the fast local engines, torch, OpenAI-compatible HTTP)
offers. A capability only some runners have is a small protocol of its own (candidates, token
healing, prompt reuse, latency prediction, adapter serving, drafted rewrites);
`RunnerCapabilities.of` checks a runner against each once, when the engine (or the server) takes
the runner, and callers then call the capability through its type. Nobody probes a runner with
`getattr`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from completion.types import CancelToken, Generation, StopRule


class ModelRunner(Protocol):
    """Turns a prompt into a continuation.

    Implementations check `cancel` between decode steps (a cancelled call returns what it has with
    `stop_reason="cancelled"` or raises `completion.types.Cancelled`), apply `stop` to the text
    generated so far after every step, and are safe to call from one worker thread at a time.
    """

    model_id: str
    """Stable identity of the weights (name plus checksum or revision); logged with decisions."""

    family: str
    """Model family used to choose a FIM template: `qwen`, `starcoder`, `codellama`, `deepseek`."""

    def count_tokens(self, text: str) -> int:
        """Number of tokens `text` takes in this model's tokenizer."""
        ...

    def generate(
        self,
        prompt: str,
        *,
        max_new_tokens: int,
        stop: StopRule,
        cancel: CancelToken,
        temperature: float = 0.0,
    ) -> Generation:
        """Continue `prompt` until `stop` cuts, EOS, `max_new_tokens`, or cancellation."""
        ...

    def close(self) -> None:
        """Release what the runner holds (memory, connections)."""
        ...


@runtime_checkable
class CandidateRunner(Protocol):
    """Candidates: several different suggestions for one prompt (an explicit request)."""

    def generate_candidates(
        self,
        prompt: str,
        *,
        count: int,
        max_new_tokens: int,
        stop: StopRule,
        cancel: CancelToken,
    ) -> list[Generation]:
        """Up to `count` continuations of `prompt`, the greedy one first, each with a different
        first token."""
        ...


@runtime_checkable
class HealingRunner(Protocol):
    """Token healing: the output can be made to start with given text (`completion.healing`)."""

    forces_text: bool
    """Whether `generate` follows `forced_text` (a wrapper of a runner that cannot says False)."""

    def generate(
        self,
        prompt: str,
        *,
        max_new_tokens: int,
        stop: StopRule,
        cancel: CancelToken,
        temperature: float = 0.0,
        forced_text: str = "",
        unfinished_word: bool = False,
    ) -> Generation:
        """`ModelRunner.generate` whose output starts with exactly `forced_text`; with
        `unfinished_word` too, a word character follows it."""
        ...


@runtime_checkable
class PromptReuseRunner(Protocol):
    """Prompt reuse: the runner keeps the model state of a fixed prompt start between calls."""

    @property
    def kept_tokens(self) -> int:
        """Length of the prompt start whose state the runner keeps (0: none)."""
        ...


@runtime_checkable
class SplitPromptRunner(Protocol):
    """A runner whose output for a prompt depends on how it splits the prompt to reuse a kept
    start (the fast engines: split prompts round differently from whole ones)."""

    @property
    def output_variant(self) -> str:
        """How this runner reads prompts now, where that changes the text it writes."""
        ...


@runtime_checkable
class PrefillCounter(Protocol):
    """Latency prediction: how much of a prompt the runner would compute now."""

    def tokens_to_read(self, prompt: str) -> int:
        """Prompt tokens the runner would compute for `prompt` (less what it keeps from before)."""
        ...


@runtime_checkable
class PrefixReader(Protocol):
    """A prompt's start read ahead of the prompt: its keys and values kept, so that a later
    prompt starting with it computes only the rest (`completion.next_edit`'s pre-read)."""

    def read_prefix(
        self,
        text: str,
        cancel: CancelToken,
        *,
        pass_tokens: int | None = None,
    ) -> int:
        """Compute the keys and values of `text` and keep them with the runner's other kept
        prompts, in passes of `pass_tokens` (the runner's own when None); the tokens computed (0
        when they were kept already). A cancelled read keeps the passes it finished and raises
        `completion.types.Cancelled`."""
        ...


@runtime_checkable
class AdapterRunner(Protocol):
    """Adapter serving: base + a LoRA adapter, swapped without a restart."""

    adapter: Path | None
    """The adapter serving now (None: the base model alone)."""

    def swap_adapter(self, adapter: Path | None) -> None:
        """Serve `adapter` (None: the base model) from the next request on; on failure the
        serving one keeps serving and the error is raised."""
        ...


@runtime_checkable
class DraftRunner(Protocol):
    """Speculative edits: greedy decoding of a rewrite that checks a caller's draft of it.

    When the output is mostly a copy of known text (a window of code rewritten with a small
    change), that text is the draft: several of its tokens are checked in one forward pass, and
    after a mismatch the draft is re-aligned to where the output rejoins it. The text is exactly
    `generate(prompt, temperature=0.0)`'s; only the number of forward passes changes.
    """

    def generate_with_draft(
        self,
        prompt: str,
        *,
        draft: str,
        max_new_tokens: int,
        stop: StopRule,
        cancel: CancelToken,
    ) -> Generation:
        """The greedy continuation of `prompt` (as `ModelRunner.generate` at temperature 0),
        checking `draft` (text the continuation likely copies, such as the current window) several
        tokens per pass. `Generation.draft_tokens`, `draft_accepted`, `verify_steps` and
        `decode_passes` say how well the draft served."""
        ...


@dataclass
class PreparedModel:
    """A model loaded on converted weights (the base, or base + an adapter), not yet serving.

    `prepare_adapter` makes it on any thread (merging and converting takes minutes on a real
    model); `install` swaps it in between two requests. `generator` is what the engine loaded: a
    CTranslate2 generator, or an ONNX Runtime GenAI model.
    """

    adapter: Path | None
    path: Path
    generator: Any
    model_id: str
    weights_sha256: str


@runtime_checkable
class PreparingAdapterRunner(AdapterRunner, Protocol):
    """Adapter serving in two steps: the slow preparation on any thread while requests go on,
    then a quick install between two requests (the runners on converted weights)."""

    def prepare_adapter(
        self, adapter: Path | None, *, progress: Callable[[str], None] | None = None
    ) -> PreparedModel:
        """A model on base + `adapter`, loaded but not serving."""
        ...

    def install(self, prepared: PreparedModel) -> None:
        """Serve `prepared` from the next request on."""
        ...


@dataclass(frozen=True)
class RunnerCapabilities:
    """What a runner offers beyond `ModelRunner`: the runner itself, typed, or None without it."""

    candidates: CandidateRunner | None = None
    healing: HealingRunner | None = None
    prompt_reuse: PromptReuseRunner | None = None
    prefill: PrefillCounter | None = None
    adapters: AdapterRunner | None = None
    preparing_adapters: PreparingAdapterRunner | None = None
    drafts: DraftRunner | None = None

    @classmethod
    def of(cls, runner: object) -> RunnerCapabilities:
        """Check `runner` against each capability (once, when it is taken into use)."""
        return cls(
            candidates=runner if isinstance(runner, CandidateRunner) else None,
            healing=runner if isinstance(runner, HealingRunner) and runner.forces_text else None,
            prompt_reuse=runner if isinstance(runner, PromptReuseRunner) else None,
            prefill=runner if isinstance(runner, PrefillCounter) else None,
            adapters=runner if isinstance(runner, AdapterRunner) else None,
            preparing_adapters=runner if isinstance(runner, PreparingAdapterRunner) else None,
            drafts=runner if isinstance(runner, DraftRunner) else None,
        )
