"""What the model sees: prefix, suffix and snippets from elsewhere, under a token budget.

Shares of the prompt budget (defaults: prefix 60%, suffix 20%, snippets 20%) are counted with the
model's own tokenizer. Budget the snippets or the suffix leave unused goes to the prefix.

The prefix window starts on an *anchor* line (a multiple of `ANCHOR_LINES` from the top of the
file) rather than at the first line that fits: while the user types, the start of the prompt then
stays put for many keystrokes, and the runner's KV-prefix cache keeps matching.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from completion.settings import CompletionSettings
from completion.types import CompletionRequest, Snippet

ANCHOR_LINES = 16

TokenCounter = Callable[[str], int]


class ContextSource(Protocol):
    """Finds snippets from other places in the workspace for a request."""

    def snippets(self, request: CompletionRequest, deadline: float) -> Sequence[Snippet]:
        """Snippets, best first. `deadline` is a `time.monotonic()` value to finish by."""
        ...


@dataclass(frozen=True)
class ContextBudget:
    """Token budget of one prompt, split in shares."""

    total: int
    prefix_share: float = 0.6
    suffix_share: float = 0.2
    snippet_share: float = 0.2

    @classmethod
    def from_settings(cls, settings: CompletionSettings) -> ContextBudget:
        return cls(
            settings.context_tokens,
            settings.prefix_share,
            settings.suffix_share,
            settings.snippet_share,
        )

    def _scaled(self) -> tuple[float, float, float]:
        # Shares need not sum to one in a user's file; scale them so they do.
        shares = (self.prefix_share, self.suffix_share, self.snippet_share)
        total = sum(shares) or 1.0
        return shares[0] / total, shares[1] / total, shares[2] / total

    @property
    def suffix_tokens(self) -> int:
        return int(self.total * self._scaled()[1])

    @property
    def snippet_tokens(self) -> int:
        return int(self.total * self._scaled()[2])

    def prefix_tokens(self, suffix_used: int, snippets_used: int) -> int:
        """The prefix gets its share plus whatever the others left unused."""
        return max(0, self.total - suffix_used - snippets_used)


@dataclass
class PromptParts:
    """The pieces of a prompt after budgeting, with their token counts."""

    prefix: str
    suffix: str
    snippets: list[Snippet] = field(default_factory=list)
    prefix_tokens: int = 0
    suffix_tokens: int = 0
    snippet_tokens: int = 0


def fit_suffix(suffix: str, budget: int, count: TokenCounter) -> tuple[str, int]:
    """The longest run of whole lines from the start of `suffix` that fits in `budget` tokens.

    The cursor's own line is kept even when it alone is over budget (cut by characters then).
    """
    if budget <= 0 or not suffix:
        return "", 0
    used = count(suffix)
    if used <= budget:
        return suffix, used
    lines = suffix.splitlines(keepends=True)
    lo, hi = 0, len(lines)  # invariant: lines[:lo] fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count("".join(lines[:mid])) <= budget:
            lo = mid
        else:
            hi = mid - 1
    if lo == 0:
        first = lines[0]
        cut = _fit_chars(first, budget, count, from_end=False)
        return cut, count(cut)
    text = "".join(lines[:lo])
    return text, count(text)


def fit_prefix(prefix: str, budget: int, count: TokenCounter) -> tuple[str, int]:
    """The end of `prefix` that fits in `budget` tokens, starting on an anchor line if it can."""
    if budget <= 0 or not prefix:
        return "", 0
    used = count(prefix)
    if used <= budget:
        return prefix, used
    lines = prefix.splitlines(keepends=True)
    anchors = list(range(0, len(lines), ANCHOR_LINES))
    # Smallest anchor whose tail fits (tails shrink as the anchor grows): binary search.
    lo, hi = 0, len(anchors)
    while lo < hi:
        mid = (lo + hi) // 2
        if count("".join(lines[anchors[mid] :])) <= budget:
            hi = mid
        else:
            lo = mid + 1
    if lo < len(anchors):
        text = "".join(lines[anchors[lo] :])
        if text.strip():
            return text, count(text)
    # Even the last anchor's tail is too long: fall back to whole lines, then characters.
    start_lo, start_hi = anchors[-1] if anchors else 0, len(lines)
    while start_lo < start_hi:
        mid = (start_lo + start_hi) // 2
        if count("".join(lines[mid:])) <= budget:
            start_hi = mid
        else:
            start_lo = mid + 1
    text = "".join(lines[start_lo:])
    if not text or count(text) > budget:
        text = _fit_chars(lines[-1], budget, count, from_end=True)
    return text, count(text)


def _fit_chars(text: str, budget: int, count: TokenCounter, *, from_end: bool) -> str:
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        piece = text[len(text) - mid :] if from_end else text[:mid]
        if count(piece) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return text[len(text) - lo :] if from_end else text[:lo]


def fit_snippets(
    snippets: Sequence[Snippet], budget: int, count: TokenCounter
) -> tuple[list[Snippet], int]:
    """Snippets in order of preference while they fit; duplicates of one text are dropped."""
    chosen: list[Snippet] = []
    seen: set[str] = set()
    used = 0
    for snippet in snippets:
        if snippet.text in seen or not snippet.text.strip():
            continue
        # The path header and separator cost tokens too.
        cost = count(snippet.path + "\n" + snippet.text) + 2
        if used + cost > budget:
            continue
        chosen.append(snippet)
        seen.add(snippet.text)
        used += cost
    return chosen, used


def assemble(
    request: CompletionRequest,
    budget: ContextBudget,
    *,
    count_tokens: TokenCounter,
    source: ContextSource | None = None,
    deadline_s: float = 0.05,
) -> PromptParts:
    """Prefix, suffix and snippets for `request`, each within its share of `budget`."""
    suffix, suffix_used = fit_suffix(request.suffix, budget.suffix_tokens, count_tokens)
    snippets: list[Snippet] = []
    snippet_used = 0
    if source is not None and budget.snippet_tokens > 0:
        found = source.snippets(request, time.monotonic() + deadline_s)
        snippets, snippet_used = fit_snippets(found, budget.snippet_tokens, count_tokens)
    prefix, prefix_used = fit_prefix(
        request.prefix, budget.prefix_tokens(suffix_used, snippet_used), count_tokens
    )
    return PromptParts(prefix, suffix, snippets, prefix_used, suffix_used, snippet_used)
