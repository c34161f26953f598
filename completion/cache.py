"""Typing-through cache: when the user types what the suggestion on screen says, the rest of it
is answered without a model call.

An entry remembers a suggestion S produced for (prefix P, suffix X). A later request with prefix
P + t and the same suffix X, where t is a prefix of S, is answered with S[len(t):]. Entries are
keyed by digests of the whole prefix and suffix, so any edit elsewhere in the document misses.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from dataclasses import dataclass

from completion.types import CompletionRequest, Generation


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


@dataclass(frozen=True)
class _Entry:
    prefix_len: int
    prefix_digest: bytes
    suffix_digest: bytes
    suggestion: str
    # "typing": a suggestion shown at this cursor; "prefetch": computed ahead for the cursor an
    # acceptance leads to, with the model's output (its log-probabilities are gate features).
    source: str = "typing"
    generation: Generation | None = None
    model_version: str = ""  # the version a remote server said wrote it (`Generation`'s)


@dataclass(frozen=True)
class Hit:
    """A cached answer: the rest of the suggestion, where it came from, and its generation."""

    text: str
    source: str
    generation: Generation | None
    model_version: str = ""


class TypingThroughCache:
    """A bounded LRU of recent suggestions, safe to use from several threads."""

    def __init__(self, *, enabled: bool = True, max_entries: int = 64) -> None:
        self.enabled = enabled
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[int, bytes, bytes], _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def clear(self) -> None:
        """Forget every suggestion (the model that wrote them no longer serves)."""
        with self._lock:
            self._entries.clear()

    def store(
        self,
        request: CompletionRequest,
        suggestion: str,
        *,
        source: str = "typing",
        generation: Generation | None = None,
        model_version: str = "",
    ) -> None:
        """Remember `suggestion` as the answer at `request`'s cursor (`model_version`: the one a
        remote server named for it, when `generation` is not kept)."""
        if not self.enabled or not suggestion:
            return
        entry = _Entry(
            len(request.prefix),
            _digest(request.prefix),
            _digest(request.suffix),
            suggestion,
            source,
            generation,
            model_version or (generation.model_version if generation is not None else ""),
        )
        key = (entry.prefix_len, entry.prefix_digest, entry.suffix_digest)
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def lookup(self, request: CompletionRequest) -> str | None:
        """The rest of a cached suggestion the user is typing through, or None."""
        hit = self.find(request)
        return hit.text if hit is not None else None

    def find(self, request: CompletionRequest) -> Hit | None:
        """The cached answer at `request`'s cursor, or None."""
        if not self.enabled:
            return None
        suffix_digest = _digest(request.suffix)
        prefix = request.prefix
        prefix_digests: dict[int, bytes] = {}
        with self._lock:
            candidates = [e for e in reversed(self._entries.values())]
        for entry in candidates:
            typed_len = len(prefix) - entry.prefix_len
            if entry.suffix_digest != suffix_digest or not 0 <= typed_len < len(entry.suggestion):
                continue
            typed = prefix[entry.prefix_len :]
            if not entry.suggestion.startswith(typed):
                continue
            # Hash each distinct prefix length once: entries of one typing run share a few.
            digest = prefix_digests.get(entry.prefix_len)
            if digest is None:
                digest = prefix_digests[entry.prefix_len] = _digest(prefix[: entry.prefix_len])
            if digest == entry.prefix_digest:
                self.hits += 1
                generation = entry.generation if typed_len == 0 else None
                return Hit(
                    entry.suggestion[typed_len:], entry.source, generation, entry.model_version
                )
        self.misses += 1
        return None
