"""The engine's vocabulary: what a completion request is and what the engine decides.

These types know nothing about LSP; `lsp_server` translates to and from them.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

TriggerKind = Literal["automatic", "invoked"]
Action = Literal["show", "silence"]


class Cancelled(Exception):
    """Raised inside the engine when the request it works for was cancelled or superseded."""


class CancelToken:
    """A flag the model loop checks between decode steps.

    Set by `$/cancelRequest`, by a newer request for the same document, or by shutdown.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def cancel(self, reason: str = "cancelled") -> None:
        self.reason = reason
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise Cancelled(self.reason)


@dataclass(frozen=True)
class CompletionRequest:
    """One request for a suggestion at a cursor position.

    `prefix` is the document text before the cursor, `suffix` the text after it. `path` is the
    document's file path (None for unsaved buffers); it is used to find context, never sent away.
    """

    prefix: str
    suffix: str
    language: str
    path: str | None = None
    uri: str = ""
    version: int = 0
    trigger: TriggerKind = "automatic"
    line: int = 0
    character: int = 0

    def after_inserting(self, text: str) -> CompletionRequest:
        """The request at the cursor after `text` is inserted there (an accepted suggestion)."""
        lines = text.split("\n")
        last = len(lines[-1].encode("utf-16-le")) // 2  # LSP counts UTF-16 code units
        return dataclasses.replace(
            self,
            prefix=self.prefix + text,
            line=self.line + len(lines) - 1,
            character=last if len(lines) > 1 else self.character + last,
        )

    @property
    def line_prefix(self) -> str:
        """Text of the cursor's line before the cursor."""
        return self.prefix[self.prefix.rfind("\n") + 1 :]

    @property
    def line_suffix(self) -> str:
        """Text of the cursor's line after the cursor."""
        end = self.suffix.find("\n")
        return self.suffix if end < 0 else self.suffix[:end]


@dataclass(frozen=True)
class Snippet:
    """Code from another place in the workspace, offered to the model as context."""

    path: str
    text: str
    score: float = 0.0
    source: Literal["index", "definition", "recent"] = "index"


@dataclass
class Generation:
    """What a model runner produced for one prompt."""

    text: str
    token_logprobs: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    reused_tokens: int = 0  # prompt tokens served from the KV-prefix cache
    new_tokens: int = 0
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    stop_reason: Literal["stop", "length", "cancelled", "eos"] = "stop"
    # The whole prompt was read (`prefill_ms` is its full time), even if cancelled afterwards.
    prefill_done: bool = False
    # Speculative decoding (greedy local runner): tokens proposed by the drafter, how many of them
    # the model agreed with, and how many forward passes checked a draft.
    draft_tokens: int = 0
    draft_accepted: int = 0
    verify_steps: int = 0
    decode_passes: int = 0  # forward passes after the prefill, drafted or not
    # Draft tokens checked in the prompt's last pass (torch's speculative edits): that pass's time
    # is in `prefill_ms`, so `decode_ms` leaves out the check of the first draft.
    prompt_pass_draft_tokens: int = 0
    # Token healing in an engine that cannot constrain a step (CTranslate2): prompts read again
    # because the model's own choice did not spell the typed text.
    forced_rereads: int = 0
    # The model version a remote server says wrote this (its `X-Tabloop-Model-Version`: `base`,
    # or a tenant's adapter version); "" when the runner serves its own weights or is not told.
    model_version: str = ""


StopRule = Callable[[str], int | None]
"""Text generated so far -> the length to cut it at when generation should stop, else None."""


@dataclass
class Timings:
    """Where the time of one request went, in milliseconds."""

    context_ms: float = 0.0
    model_ms: float = 0.0
    total_ms: float = 0.0
    syntax_ms: float = 0.0  # the syntax check in place (`completion.syntax`)
    # A latency skip's reasons: the predicted time to the first token, and the likely rest of
    # the user's pause it was longer than (`completion.latency`).
    predicted_ms: float = 0.0
    likely_pause_ms: float = 0.0


LATENCY_SKIP = "the suggestion could not arrive before the next keystroke"


class TooLate(Exception):
    """Raised by `Engine.complete(..., defer_late=True)` instead of answering a latency skip:
    with its prompt built, the request's first token is predicted (`predicted_ms`) after the
    pause the user will probably leave; the caller may wait for the pause to turn out longer
    and ask again. Nothing was counted or recorded."""

    def __init__(self, predicted_ms: float) -> None:
        super().__init__(f"first token predicted in {predicted_ms:.0f} ms")
        self.predicted_ms = predicted_ms


@dataclass
class Decision:
    """The engine's answer: a suggestion and whether to show it.

    `text` is the suggestion whether or not it is shown (its length is a policy feature);
    `shown` says whether the editor gets it.

    `propensity` is the probability with which the policy chose `action`: the learning loop
    needs it.
    """

    decision_id: str
    action: Action
    text: str = ""
    propensity: float = 1.0
    policy_version: str = "builtin"
    model_id: str = ""
    features: dict[str, float | str] = field(default_factory=dict)
    timings: Timings = field(default_factory=Timings)
    cache_hit: bool = False
    # The action taken, or why the suggestion is empty (`postprocess.clean_with_reason`), or
    # LATENCY_SKIP.
    reason: str = ""
    generation: Generation | None = None
    # Where a cached answer came from: "typing" (typed through) or "prefetch"; "" for none.
    cache_source: str = ""
    # Several candidates (an explicit request): the others, ranked after this one (rank 0).
    alternatives: list[Decision] = field(default_factory=list)
    rank: int = 0
    request_id: str = ""
    # What the syntax check did to the suggestion: kept, cut, dropped, or unchecked.
    syntax: str = "unchecked"
    # The model version a remote server named for the suggestion (`Generation.model_version`,
    # kept through the typing cache); "" when the runner serves its own weights.
    model_version: str = ""

    @property
    def shown(self) -> bool:
        return self.action == "show" and bool(self.text)

    @property
    def silence_reason(self) -> Literal["policy", "empty", "latency"] | None:
        """Why nothing is shown: the gate chose silence, nothing worth showing, or too late."""
        if self.shown:
            return None
        if self.reason == LATENCY_SKIP:
            return "latency"
        return "empty" if not self.text else "policy"

    @staticmethod
    def new_id() -> str:
        return uuid.uuid4().hex
