"""The interface every model runner implements (local torch, OpenAI-compatible HTTP)."""

from __future__ import annotations

from typing import Protocol

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
