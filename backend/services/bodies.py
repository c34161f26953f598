"""Bounds on request bodies, checked on the raw bytes before any JSON parser sees them.

Python's `json` recurses once per nested array or object and gives up with `RecursionError` near
a thousand levels; pydantic's parser stops earlier with its own error. Either way the depth is
best refused before parsing, in one place for every route that reads JSON: `exceeds_depth`
measures the nesting of the raw bytes in linear time (strings skipped, so brackets inside them do
not count) without building anything.
"""

from __future__ import annotations

import re

import numpy as np

# A JSON string, or an unterminated one running to the end: every match succeeds, and possessive
# quantifiers never backtrack, so a body of escaped quotes costs one pass, not one per quote.
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.DOTALL)
# Opening brackets become 2 and closing ones 0; everything else is deleted. Minus one, a step.
_STEPS = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_CHUNK = 1 << 20  # steps summed a mebibyte at a time: bounded scratch memory


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in `raw` (0 for a scalar).

    Brackets inside strings do not count. On malformed input it is the nesting a parser could
    reach before failing, or more (unbalanced brackets are counted as they come).
    """
    brackets = _STRING.sub(b"", raw).translate(_STEPS, _NOT_BRACKETS)
    depth = deepest = 0
    for start in range(0, len(brackets), _CHUNK):
        steps = np.frombuffer(brackets, np.int8, min(_CHUNK, len(brackets) - start), start) - 1
        levels = np.cumsum(steps, dtype=np.int64)
        deepest = max(deepest, depth + int(levels.max()))
        depth += int(levels[-1])
    return deepest


def exceeds_depth(raw: bytes, max_depth: int) -> bool:
    """Whether `raw` nests arrays and objects deeper than `max_depth`."""
    # A body with few brackets cannot be deep: no scan needed for small requests.
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return False
    return json_depth(raw) > max_depth
