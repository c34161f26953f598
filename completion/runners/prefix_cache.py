"""KV-prefix reuse: keep the attention cache of recent prompts and continue from the longest match.

Consecutive completion prompts in one file share almost everything: a keystroke changes a few
tokens near the cursor. Keeping the key/value cache of the last prompts and cropping it to the
longest common token prefix lets the next request prefill only the tokens that changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens `a` and `b` share."""
    limit = min(len(a), len(b))
    for index in range(limit):
        if a[index] != b[index]:
            return index
    return limit


def crop_cache(cache: Any, keep: int) -> None:
    """Shrink a transformers cache to its first `keep` positions.

    A negative argument to `crop` means "remove this many" in every transformers release that has
    `DynamicCache.crop`, while the meaning of a positive one changed; so always pass the negative.
    """
    remove = cache.get_seq_length() - keep
    if remove > 0:
        cache.crop(-remove)


def crop_layers(cache: Any, keep: int) -> bool:
    """Shrink every layer of a transformers cache to its first `keep` positions, each by its own
    length: after a forward pass stopped between two layers, the layers before the stop hold
    more positions than those after it. False when this transformers release keeps no layer
    objects (the cache cannot be trusted then)."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        return False
    for layer in layers:
        keys = getattr(layer, "keys", None)
        if keys is None or not getattr(layer, "is_initialized", True):
            continue
        remove = keys.shape[-2] - keep
        if remove > 0:
            layer.crop(-remove)
    return True


@dataclass
class CacheEntry:
    """A KV cache and the tokens whose keys and values it holds, in order."""

    tokens: list[int]
    cache: Any


class PrefixCache:
    """A few KV caches of recent prompts, most recently used first.

    `take` removes the best entry (the caller extends it in place while decoding) and `put` returns
    it; an entry in use is never shared, and one that failed half-way is simply not put back.
    """

    def __init__(self, max_entries: int = 2, max_tokens: int = 4096) -> None:
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self._entries: list[CacheEntry] = []

    def __len__(self) -> int:
        return len(self._entries)

    def reusable(self, tokens: Sequence[int]) -> int:
        """How many of `tokens` `take` would serve from an entry now (nothing is taken)."""
        best = max((common_prefix_length(e.tokens, tokens) for e in list(self._entries)), default=0)
        return max(0, min(best, len(tokens) - 1))

    def holds(self, tokens: Sequence[int]) -> bool:
        """Whether an entry holds all of `tokens` (as its first tokens)."""
        return any(common_prefix_length(e.tokens, tokens) == len(tokens) for e in self._entries)

    def take(self, tokens: Sequence[int]) -> tuple[CacheEntry | None, int]:
        """The entry sharing the longest prefix with `tokens`, cropped to it, and that length.

        At least one token of the prompt is always left to prefill: the model must see it to
        produce the next token's logits.
        """
        best_index, best_length = -1, 0
        for index, entry in enumerate(self._entries):
            length = common_prefix_length(entry.tokens, tokens)
            if length > best_length:
                best_index, best_length = index, length
        if best_index < 0:
            return None, 0
        entry = self._entries.pop(best_index)
        reuse = min(best_length, len(tokens) - 1)
        if reuse <= 0:
            return None, 0
        crop_cache(entry.cache, reuse)
        del entry.tokens[reuse:]
        return entry, reuse

    def put(self, entry: CacheEntry) -> None:
        """Keep `entry` as the most recent one, evicting the oldest beyond `max_entries`."""
        if len(entry.tokens) > self.max_tokens or self.max_entries <= 0:
            return
        self._entries.insert(0, entry)
        del self._entries[self.max_entries :]

    def clear(self) -> None:
        self._entries.clear()
