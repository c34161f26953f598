"""Token healing: which tokens may come first when the model must rewrite what the user typed.

A prompt that ends inside a token (`if isinst`, `os.pa`, `x <`) shows the model a token split
where its training data never had one, and models then continue after the fragment
(`if isinst instream`) instead of completing it. The engine backs the prompt off to the start of
the fragment (`completion.context.TypedTail`) and the runner constrains its first generated
tokens to spell the fragment again: each step while the text generated so far is shorter than the
fragment may only take a token that extends it consistently. The model is then free to choose
`" isinstance"` as one token, as it saw it in training.

`VocabIndex` answers, for the part of the fragment still to be written, the ids of the tokens
that fit: those whose text starts with it (they finish it) and those whose text is a start of it
(they write part of it). It is built once per runner from the decoded text of every token and
answers from the sorted texts by bisection, so each step costs a few of them.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

# Tokens whose text is a byte of a multi-byte character decode to this; they never fit typed text.
REPLACEMENT = "\ufffd"
_MAX_REMEMBERED = 256


class VocabIndex:
    """The decoded text of every token of a vocabulary, searchable by prefix."""

    def __init__(self, texts: Sequence[str], excluded: Iterable[int] = ()) -> None:
        skip = set(excluded)
        pairs = sorted(
            (text, token)
            for token, text in enumerate(texts)
            if text and token not in skip and REPLACEMENT not in text
        )
        # The texts sorted, and each one's token beside it: tokens of equal text are neighbours,
        # so the tokens spelling exactly a string are a range found by two bisections. (Held in
        # the server for its lifetime: a dictionary of the exact texts and a list of ints took
        # 20 of the 32 MB this took for a 150k-token vocabulary.)
        self._texts = [text for text, _ in pairs]
        self._ids = np.fromiter((token for _, token in pairs), dtype=np.int32, count=len(pairs))
        self._remembered: OrderedDict[tuple[str, bool], frozenset[int]] = OrderedDict()
        self._lock = threading.Lock()
        self.size = len(texts)

    def allowed(self, remaining: str, unfinished_word: bool = False) -> frozenset[int]:
        """Ids of the tokens that may come next while `remaining` (non-empty) is still to be
        written: their text starts with `remaining`, or `remaining` starts with their text.

        `unfinished_word`: the typed text ends inside a word that is not complete (`hasattr(socke`),
        so the token that finishes it must go on with a word character; a token that ends exactly
        where the typing ended would take the fragment for the whole word.
        """
        key = (remaining, unfinished_word)
        with self._lock:
            known = self._remembered.get(key)
            if known is not None:
                self._remembered.move_to_end(key)
                return known
        found: set[int] = set()
        lo = bisect.bisect_left(self._texts, remaining)
        hi = bisect.bisect_left(self._texts, remaining + "\U0010ffff", lo)
        if unfinished_word:
            cut = len(remaining)
            found.update(
                int(token)
                for text, token in zip(self._texts[lo:hi], self._ids[lo:hi], strict=True)
                if len(text) > cut and _is_word_char(text[cut])
            )
        else:
            found.update(self._ids[lo:hi].tolist())
        for end in range(1, len(remaining)):
            found.update(self._spelling(remaining[:end]))
        result = frozenset(found)
        with self._lock:
            self._remembered[key] = result
            if len(self._remembered) > _MAX_REMEMBERED:
                self._remembered.popitem(last=False)
        return result

    def _spelling(self, text: str) -> list[int]:
        """The tokens whose text is exactly `text`."""
        lo = bisect.bisect_left(self._texts, text)
        hi = bisect.bisect_right(self._texts, text, lo)
        return self._ids[lo:hi].tolist()

    def text(self, token: int) -> str:
        """The decoded text of `token` ("" for one not indexed)."""
        # Rarely needed (tests, diagnostics): a linear search is fine.
        at = np.flatnonzero(self._ids == token)
        return self._texts[int(at[0])] if at.size else ""


def _is_word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


def best_allowed(logits: Any, allowed: Iterable[int]) -> tuple[int, float]:
    """The most likely of the `allowed` tokens and its log-probability among all tokens.

    `logits` is one row of next-token scores (anything numpy reads). The log-probability is the
    model's own (not renormalised over the allowed tokens), so the gate's confidence features see
    how sure the model was. Raises ValueError when no token is allowed.
    """
    ids = np.fromiter(allowed, dtype=np.int64)
    if ids.size == 0:
        raise ValueError("no token fits the typed text")
    row = np.asarray(logits, dtype=np.float64).reshape(-1)
    best = int(ids[np.argmax(row[ids])])
    top = row.max()
    log_total = top + math.log(float(np.exp(row - top).sum()))
    return best, float(row[best] - log_total)


def token_texts(decode_one: Iterable[str], raw: Iterable[str]) -> list[str]:
    """Per-token text from single-token decodes, restoring the leading space that SentencePiece
    decoders drop from a sequence's first token (raw pieces starting with `▁`)."""
    texts = []
    for decoded, piece in zip(decode_one, raw, strict=True):
        if piece.startswith("\u2581") and not decoded.startswith(" "):
            decoded = " " + decoded
        texts.append(decoded)
    return texts
