"""Draft tokens for speculative decoding, taken from the code itself (prompt lookup, rewrites).

Code repeats itself: names, argument lists, the rest of a line seen a few lines up. When the last
few tokens of the text so far occurred before, the tokens that followed them then are a good guess
for what follows now. The runner checks such a guess in one forward pass and keeps the longest
prefix the model agrees with, so a good guess saves forward passes and a bad one costs little.

`RewriteDrafter` drafts a rewrite of known text (a window of code the model writes again with a
change) from that text, following the output through it.

The prompt-lookup drafter keeps, for every n-gram (n = 1 … `max_ngram`) of the token sequence,
where it last occurred with at least one token after it; appending a token and proposing a draft
are O(n).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol


class PromptLookupDrafter:
    """Proposes the tokens that followed the most recent earlier occurrence of the current tail.

    The longest tail that occurred before wins (`max_ngram` tokens down to `min_ngram`): a longer
    match is a more reliable guess. `extra` is text the drafter may copy from without it being
    part of the sequence (for example code the user just deleted); for each tail length the
    sequence is searched first.
    """

    def __init__(
        self,
        tokens: Sequence[int] = (),
        *,
        max_ngram: int = 3,
        min_ngram: int = 1,
        extra: Sequence[int] = (),
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.tokens: list[int] = []
        # n-gram -> index just after its most recent occurrence that has a token following it.
        self._ends: dict[tuple[int, ...], int] = {}
        self._extra = list(extra)
        self._extra_ends: dict[tuple[int, ...], int] = {}
        for end in range(1, len(self._extra)):
            self._register(self._extra, end, self._extra_ends)
        self.extend(tokens)

    def _register(self, tokens: list[int], end: int, ends: dict[tuple[int, ...], int]) -> None:
        """Record the n-grams that end at `end` (exclusive); `tokens[end]` follows them."""
        for n in range(self.min_ngram, self.max_ngram + 1):
            if end >= n:
                ends[tuple(tokens[end - n : end])] = end

    def append(self, token: int) -> None:
        """Add one token at the end of the sequence."""
        self.tokens.append(token)
        # The n-grams ending just before the new token now have a continuation.
        if len(self.tokens) >= 2:
            self._register(self.tokens, len(self.tokens) - 1, self._ends)

    def extend(self, tokens: Iterable[int]) -> None:
        """Add tokens at the end of the sequence."""
        for token in tokens:
            self.append(token)

    def propose(self, count: int) -> list[int]:
        """Up to `count` tokens that may come next; empty when the tail occurred nowhere before."""
        if count <= 0 or not self.tokens:
            return []
        for n in range(min(self.max_ngram, len(self.tokens)), self.min_ngram - 1, -1):
            tail = tuple(self.tokens[-n:])
            end = self._ends.get(tail)
            if end is not None:
                return _continuation(self.tokens, end, count)
            end = self._extra_ends.get(tail)
            if end is not None:
                return self._extra[end : end + count]
        return []


def _continuation(tokens: Sequence[int], end: int, count: int) -> list[int]:
    """`count` tokens from `end` on, as the sequence would continue if the match held.

    A match that ends close to the end of the sequence runs out of tokens to copy; the text then
    repeats with period `len(tokens) - end` (the tail equals the tokens before `end`), so the
    draft continues by repeating itself.
    """
    draft = list(tokens[end : end + count])
    period = len(tokens) - end
    while len(draft) < count and period > 0:
        draft.append(draft[len(draft) - period])
    return draft


def respeller(
    decode: Callable[[list[int]], str], encode: Callable[[str], list[int]]
) -> Callable[[int, int], list[int] | None]:
    """`RewriteDrafter`'s respell for a tokenizer: the tokens of `expected`'s text after
    `token`'s, when `token`'s text starts it and is shorter; else None."""

    def respell(expected: int, token: int) -> list[int] | None:
        whole, part = decode([expected]), decode([token])
        if not part or len(part) >= len(whole) or not whole.startswith(part) or "\ufffd" in whole:
            return None
        return encode(whole[len(part) :])

    return respell


class Drafter(Protocol):
    """What a speculative decode loop asks of its source of draft tokens."""

    def append(self, token: int) -> None:
        """Take the next token the model chose."""
        ...

    def propose(self, count: int) -> list[int]:
        """Up to `count` tokens that may come next (empty: decode one token plainly)."""
        ...


class RewriteDrafter:
    """Drafts a rewrite from the text it rewrites (speculative edits).

    When the model writes a new version of a window of code, most of its output copies the current
    window. The drafter follows the output through the window: `position` is where in `draft` the
    next output token is expected, and `copied` is where the output last copied the window. While
    the output copies, both move on and the draft is the window from there. At a mismatch the
    drafter re-aligns: it looks for the output's last `max_ngram` tokens (down to `min_ngram`) in
    the window, ending at or after `copied` (the rewrite keeps the window's order and does not copy
    the same text twice), takes the nearest occurrence of the longest tail found, and continues
    just after it. When no tail is found (the model writes new text), the draft resumes at
    `copied`: an insertion ends where the window goes on, and a changed token is followed by the
    window's next ones, which the next re-alignment finds.

    With `context` (the prompt's tokens), new text gets drafts too: while the output is off the
    window (no tail of two or more tokens found there) or past its end, the draft is what followed
    the output's last tokens in the context or earlier in the output (`PromptLookupDrafter`, tails
    of `CONTEXT_MIN_NGRAM` tokens or more), when they occurred there. A rewrite's new text is
    often there: a rename carried through writes the name the latest edit wrote, and a rewrite that
    puts the window back as it was before the edit copies the prompt's `original` block. Measured
    on replayed commits, such rewrites took one forward pass per token without it
    (docs/next-edit.md).

    With `respell(expected, token)` (the tokens that spell the rest of `expected`'s text after
    `token`'s, or None when `token`'s text does not start it), an output that writes the window's
    text in shorter tokens stays on it: the rest of the expected token is drafted, then the window
    after it. An output that leaves that rest (an insertion that began like the expected token)
    is back at the token, and the window is as it was.
    """

    CONTEXT_MIN_NGRAM = 2

    def __init__(
        self,
        draft: Sequence[int],
        *,
        max_ngram: int = 4,
        min_ngram: int = 1,
        context: Sequence[int] = (),
        respell: Callable[[int, int], list[int] | None] | None = None,
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.draft = list(draft)
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.position = 0
        self.copied = 0
        self.output: list[int] = []
        self.off_window = False
        """The output's last tokens are not the window's (no tail of two tokens found there)."""
        self._respell = respell
        self._spelled: list[int] = []  # the rest of a window token the output began
        # n-gram -> the indices just after its occurrences in the draft, in order.
        self._ends: dict[tuple[int, ...], list[int]] = {}
        for end in range(1, len(self.draft) + 1):
            for n in range(min_ngram, min(max_ngram, end) + 1):
                self._ends.setdefault(tuple(self.draft[end - n : end]), []).append(end)
        self._lookup = (
            PromptLookupDrafter(
                context,
                max_ngram=max(max_ngram, self.CONTEXT_MIN_NGRAM),
                min_ngram=self.CONTEXT_MIN_NGRAM,
            )
            if context
            else None
        )

    def append(self, token: int) -> None:
        """Take the next output token: follow the draft, or re-align to it."""
        self.output.append(token)
        if self._lookup is not None:
            self._lookup.append(token)
        if self._spelled and self._follow_spelling(token):
            return
        if self.position < len(self.draft) and self.draft[self.position] == token:
            self.position += 1
            self.copied = self.position
            self.off_window = False
            return
        rest = (
            self._respell(self.draft[self.position], token)
            if self._respell is not None and self.position < len(self.draft)
            else None
        )
        if rest:
            # The output began the expected token's text in a shorter token (a blank line
            # written "\n" "\n" where the window has "\n\n"): the rest of that text is drafted
            # next, then the window after the token.
            self._spelled = rest
            self.position += 1
            self.off_window = False
            return
        for n in range(min(self.max_ngram, len(self.output)), self.min_ngram - 1, -1):
            ends = self._ends.get(tuple(self.output[-n:]))
            found = bisect_left(ends, self.copied) if ends else 0
            if ends and found < len(ends):
                self.position = ends[found]
                self.off_window = n < 2
                return
        self.position = self.copied
        self.off_window = True

    def _follow_spelling(self, token: int) -> bool:
        """Take `token` against the rest of a token the output began in a shorter one: True when
        it spells on (the token's text done when nothing is left), False when the output left
        it (the draft is back at that token, the window unchanged)."""
        rest = (
            self._respell(self._spelled[0], token)
            if self._respell is not None and token != self._spelled[0]
            else None
        )
        if token == self._spelled[0] or rest:
            self._spelled[:1] = rest or []
            if not self._spelled:
                self.copied = self.position
            return True
        self._spelled = []
        self.position = self.copied
        return False

    def propose(self, count: int) -> list[int]:
        """The draft's next `count` tokens from where the output is now (from the context when
        the output is off the window or past its end and the context has a guess)."""
        if count <= 0:
            return []
        window = (self._spelled + self.draft[self.position : self.position + count])[:count]
        if self._lookup is not None and (self.off_window or not window):
            guess = self._lookup.propose(count)
            if guess:
                return guess
        return window
