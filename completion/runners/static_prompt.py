"""Which first part of a prompt the fast engine keeps between keystrokes (a static prompt).

CTranslate2 can start a generation from the model state after a fixed first part of the prompt, a
"static prompt", and keep that state for the next call (`cache_static_prompt=True`). While the
user types, a fill-in-the-middle prompt changes only near the cursor: everything from the start of
the prompt (snippets, the file's earlier lines) to a few lines above the cursor stays the same, so
the next keystroke's prompt need only read the cursor's lines and the suffix.

Two constraints shape the split:

- **The same request gives the same text.** A state computed from a split prompt differs from the
  whole prompt's state by int8 rounding, and greedy decoding can follow that difference. So where a
  prompt is split depends on the prompt alone, never on what came before: the static part ends
  at the last line break at or before a grid point `GRID` tokens wide, at least `MARGIN` tokens
  before the cursor. Typing moves the cursor but not the grid point, so the static part stays the
  same for a few lines and then moves on by one grid step. Whether its state is read from the
  cache or computed again, the result is the same.
- **Memory.** The engine keeps the state of every static part it was asked to keep and never lets
  one go (about 170 KB per token for the bundled model). So a static part is kept only when the
  previous request used it too (a user typing here, not a one-off request elsewhere), and keeping
  a new one first empties the engine's cache by reloading the model: at most one is held.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

Action = Literal["hit", "keep", "reset", "once"]

GRID = 64  # tokens: the static part moves on in steps of about this much
MARGIN = 16  # tokens: the static part ends at least this far before the cursor
MIN_TOKENS = 96  # a shorter first part is not worth a separate pass


class StaticPrompt:
    """Chooses each prompt's static part and which one the engine keeps.

    `marker` is the token that follows the text before the cursor in the fill-in-the-middle
    template (the suffix marker); a prompt without it is never split. `breaks(token)` says
    whether a token holds a line break.
    """

    def __init__(
        self,
        marker: int | None,
        breaks: Callable[[int], bool],
        *,
        max_tokens: int = 2048,
    ) -> None:
        self.marker = marker
        self.breaks = breaks
        self.max_tokens = max_tokens
        self.kept: tuple[int, ...] | None = None  # the static part the engine holds
        self._last: tuple[int, ...] | None = None  # the static part of the previous request
        self.hits = 0
        self.resets = 0

    @property
    def variant(self) -> str:
        """The split rule, for keys of outputs computed with it."""
        return f"static-prompt grid {GRID} margin {MARGIN} min {MIN_TOKENS} max {self.max_tokens}"

    def split(self, ids: Sequence[int]) -> int:
        """How many of `ids` form the static part: 0 when the prompt is read whole."""
        if self.marker is None:
            return 0
        try:
            cursor = list(ids).index(self.marker)
        except ValueError:
            return 0
        point = min((cursor - MARGIN) // GRID * GRID, self.max_tokens)
        for end in range(point, MIN_TOKENS - 1, -1):
            if self.breaks(ids[end]):
                return end  # the line break itself starts the part read each time
        return 0

    def decide(self, static: Sequence[int]) -> Action:
        """What to do with a request's static part `static`:

        - `hit`: the engine keeps its state; the request reads only the rest;
        - `keep`: compute it and keep it (the engine keeps nothing now);
        - `reset`: empty the engine's cache, then compute it and keep it;
        - `once`: compute it without keeping it (the previous request had another one).

        After `keep`, and after `reset` once the cache is empty, the caller records the part
        with `kept_now`.
        """
        key = tuple(static)
        repeated, self._last = key == self._last, key
        if key == self.kept:
            self.hits += 1
            return "hit"
        if not repeated:
            return "once"
        return "keep" if self.kept is None else "reset"

    def kept_now(self, static: Sequence[int], *, reset: bool) -> None:
        """The engine keeps the state of `static` from now on (and only that one)."""
        self.kept = tuple(static)
        self.resets += reset

    def forget(self) -> None:
        """The engine's cache was emptied (a reload, a new model)."""
        self.kept = None
