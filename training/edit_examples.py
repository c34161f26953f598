"""Next-edit training examples: the prompt the predictor writes, and the window the user settled on.

One function makes an example from what a prediction sees (the document, the cursor, the
workspace's `EditHistory`) and the text the user settled on afterwards (`edit_example`): the
target is the predictor's window in the settled text when the user's change lies inside that
window, the window as it is when the change lies wholly outside it ("no change" is a lesson
too), and no example when it straddles the window's edge. Two sources feed it:

- a repository's history (`replay_examples`): the points of `training.edit_replay` over older
  commits than the ones judged (train on older, judge on newer), each point's history recorded
  in a fresh `EditHistory` on a simulated clock (`history_at`), the target the text after the
  next hunk;
- the server's live history: the document, cursor and history at a pause, and the document some
  seconds later (the settled text) as the target; the same call.

Examples whose change undoes the user's previous edit are dropped (a user undoing is not the
edit to learn), as are prompts or targets past the token budgets; no-change examples are kept up
to `no_change_share` of the whole, drawn with the seed. An example is a `FimExample` whose
prefix is the whole prompt and whose middle is the window to write followed by `<|file_sep|>`,
trained with the verbatim template `EDIT_TEMPLATE`, so `training.trainer.Trainer` trains on it
as it is.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from completion.fim import FimTemplate
from completion.next_edit import EditHistory, NextEditSettings
from completion.next_edit.diff import reverts
from completion.next_edit.prompt import (
    FILE_SEP,
    build_prompt,
    history_blocks,
    original_window,
    settings_window,
)
from completion.next_edit.text import common_ends, document_lines
from completion.types import Snippet
from training.edit_replay import EditPoint, ReplayedEdit, WindowRule
from training.examples import FimExample, seeded_random

EDIT_GAP_S = 5.0
"""Simulated seconds between replayed edits: longer than the history's merge pause, as a user
moving from one change to the next pauses."""
PAUSE_S = 0.5
"""Simulated seconds from the last edit to the prediction (the pause that asks for it)."""
NO_CHANGE_SHARE = 0.3
EDIT_KIND = "edit"
"""The `FimExample.kind` of a next-edit example: the trainer reads its prompt verbatim."""
EDIT_TRAINING_FILE = "edit_training.json"
"""Written into an adapter directory trained on a history: the commits it learned from."""


def _verbatim(
    prefix: str, suffix: str, snippets: Sequence[Snippet], path: str | None, repo: str
) -> str:
    return prefix


EDIT_TEMPLATE = FimTemplate("next-edit", (FILE_SEP,), _verbatim)
"""The trainer's template for edit examples: the prompt is the example's prefix, as it is."""


def history_at(edits: Sequence[ReplayedEdit]) -> tuple[EditHistory, float]:
    """The server's history after `edits` (oldest first) on a simulated clock, `EDIT_GAP_S`
    apart, and the time a prediction is asked (`PAUSE_S` after the last)."""
    clock = 0.0
    history = EditHistory(clock=lambda: clock)
    for edit in edits:
        clock += EDIT_GAP_S
        history.record_edit(
            edit.path,
            document_lines(edit.after),
            edit.start_line,
            0,
            edit.removed,
            edit.inserted,
            now=clock,
        )
    return history, clock + PAUSE_S


def token_windows(count_tokens: Callable[[str], int], settings: NextEditSettings) -> WindowRule:
    """The windows `completion.next_edit.NextEditPredictor` rewrites, for a tokenizer."""

    def rule(lines: Sequence[str], line: int) -> tuple[int, int] | None:
        window = settings_window(lines, line, settings, count_tokens)
        return None if window is None else (window.start, window.end)

    return rule


@dataclass(frozen=True)
class EditExample:
    """A prompt and the window the model should write for it (empty change: the window as is)."""

    path: str
    prompt: str
    current: str  # the window now
    target: str  # the window the user settled on
    source: str  # "history" (a commit) or "live"
    commit: str = ""  # a history example's commit (the change it replays)

    @property
    def no_change(self) -> bool:
        return self.current == self.target

    @property
    def key(self) -> str:
        """The example's identity across runs: a digest of its path, prompt and target."""
        digest = hashlib.sha256()
        for part in (self.path, self.prompt, self.target):
            digest.update(part.encode("utf-8", "surrogatepass") + b"\0")
        return digest.hexdigest()[:20]

    def fim(self) -> FimExample:
        """As the trainer takes it (with `EDIT_TEMPLATE`)."""
        return FimExample(
            self.path,
            self.prompt,
            self.target + FILE_SEP,
            "",
            EDIT_KIND,
            draft=self.current + FILE_SEP,
        )


def settled_window(
    lines: Sequence[str], settled: Sequence[str], start: int, end: int
) -> str | None:
    """Lines [start, end) of `lines` as they are in `settled`: the window after the user's change
    when the change lies inside it, as it is when the change lies outside, None when the change
    crosses its edge. (Lines inserted right above the window count as inside, right below it
    as outside, as `training.edit_replay` counts them.)"""
    head, tail = common_ends(lines, settled)
    changed_end = len(lines) - tail  # the change replaced lines [head, changed_end)
    window = "".join(lines[start:end])
    if lines == settled or head >= end or (changed_end <= start and head < start):
        return window
    if head >= start and changed_end <= end:
        return "".join(settled[start : end + len(settled) - len(lines)])
    return None


def edit_example(
    path: str,
    text: str,
    cursor: tuple[int, int],
    history: EditHistory,
    settled: str,
    count_tokens: Callable[[str], int],
    settings: NextEditSettings,
    source: str = "live",
) -> EditExample | None:
    """The example of one prediction: the prompt `completion.next_edit.NextEditPredictor` would
    write for document `path` (`text`, the cursor, `history`), and the window in the `settled`
    text as the target; None when there is no window or the change crosses its edge."""
    lines = document_lines(text)
    window = settings_window(lines, cursor[0], settings, count_tokens)
    if window is None:
        return None
    target = settled_window(lines, document_lines(settled), window.start, window.end)
    if target is None:
        return None
    blocks = history_blocks(
        history.events(),
        max_events=settings.history_events,
        max_tokens=settings.history_tokens,
        count_tokens=count_tokens,
    )
    original = original_window(window, history.latest(path))
    prompt = build_prompt(path, blocks, original, window)
    return EditExample(path, prompt, window.text, target, source)


@dataclass
class ExampleCounts:
    """What became of the points: kept (edits, no change) or dropped, by reason."""

    counts: Counter[str] = field(default_factory=Counter)

    def summary(self) -> dict[str, int]:
        return dict(sorted(self.counts.items()))


def replay_examples(
    points: Sequence[EditPoint],
    count_tokens: Callable[[str], int],
    settings: NextEditSettings,
    *,
    max_prompt_tokens: int,
    no_change_share: float | None = NO_CHANGE_SHARE,
    seed: int = 0,
) -> tuple[list[EditExample], ExampleCounts]:
    """Examples from replayed points (commit order), with at most `no_change_share` of them
    no-change examples (drawn with `seed`; None: every one, as the history has them), those
    undoing the previous edit and those whose prompt is over `max_prompt_tokens` dropped."""
    if no_change_share is not None and not 0 <= no_change_share < 1:
        raise ValueError(f"no_change_share must be in [0, 1), not {no_change_share}")
    found = ExampleCounts()
    kept: list[EditExample] = []
    for point in points:
        if point.expects_change and reverts(point.text, point.target, point.history[-1:]):
            found.counts["dropped_undoes_previous_edit"] += 1
            continue
        history, _ = history_at(point.history)
        example = edit_example(
            point.path,
            point.text,
            point.cursor,
            history,
            point.target,
            count_tokens,
            settings,
            source="history",
        )
        if example is None:
            found.counts["dropped_no_window"] += 1
            continue
        if count_tokens(example.prompt) > max_prompt_tokens:
            found.counts["dropped_prompt_too_long"] += 1
            continue
        kept.append(replace(example, commit=point.commit))
    examples, dropped = (
        capped_no_change(kept, no_change_share, seed) if no_change_share is not None else (kept, 0)
    )
    if dropped:
        found.counts["dropped_no_change_over_share"] += dropped
    found.counts["no_change"] = sum(example.no_change for example in examples)
    found.counts["edit"] = len(examples) - found.counts["no_change"]
    return examples, found


def capped_no_change(
    examples: Sequence[EditExample], no_change_share: float, seed: int
) -> tuple[list[EditExample], int]:
    """`examples` in their order with at most `no_change_share` of them no-change examples (the
    ones kept drawn with `seed`), and how many no-change examples were dropped."""
    if not 0 <= no_change_share < 1:
        raise ValueError(f"no_change_share must be in [0, 1), not {no_change_share}")
    unchanged = [index for index, example in enumerate(examples) if example.no_change]
    wanted = round((len(examples) - len(unchanged)) * no_change_share / (1 - no_change_share))
    if len(unchanged) <= wanted:
        return list(examples), 0
    dropped = set(unchanged) - set(random.Random(seed).sample(unchanged, wanted))
    return [e for index, e in enumerate(examples) if index not in dropped], len(dropped)


@dataclass(frozen=True)
class HistoryRead:
    """How far a chain of versions has read its history's examples: the lap it is in (a pass
    over the examples in an order of its own) and the examples read in that lap, by `key`.

    A next-edit version warm-started from another goes on where that one stopped
    (`history_laps`), so that a chain of versions reads what one long run would, rather than
    every version reading the first examples of the same order again."""

    lap: int = 0
    keys: frozenset[str] = frozenset()

    def record(self) -> dict[str, Any]:
        return {"lap": self.lap, "keys": sorted(self.keys)}

    @classmethod
    def from_record(cls, record: object) -> HistoryRead:
        """From `record` (an adapter's `history_read`); a missing or damaged one reads as
        nothing read, so a chain starts its first lap again rather than fail."""
        if not isinstance(record, dict):
            return cls()
        lap, keys = record.get("lap"), record.get("keys")
        if not isinstance(lap, int) or lap < 0 or not isinstance(keys, list):
            return cls()
        return cls(lap, frozenset(key for key in keys if isinstance(key, str)))

    def unread(self, examples: Sequence[EditExample]) -> int:
        """How many of `examples` this lap has still to read."""
        return sum(example.key not in self.keys for example in examples)


def history_laps(
    examples: Sequence[EditExample],
    seed: int,
    read: HistoryRead | None = None,
    known: Collection[str] = (),
) -> Iterator[tuple[int, EditExample]]:
    """The examples lap after lap, each lap in a seeded order (a pure function of its arguments,
    as the trainer's resume needs), with the lap each is read in. The examples `read` has read in
    its lap are left out of it, and the rest of that lap reads first the examples of commits
    outside `known` (the commits the chain had trained on: these are the history's new ones)."""
    if not examples:
        return
    read = read or HistoryRead()
    lap, done = read.lap, read.keys
    while True:
        order = list(range(len(examples)))
        seeded_random(seed, "edits", lap).shuffle(order)
        rest = [examples[index] for index in order if examples[index].key not in done]
        if known:
            rest.sort(key=lambda example: example.commit in known)  # stable: new ones first
        for example in rest:
            yield lap, example
        lap, done, known = lap + 1, frozenset(), ()


def read_after(
    examples: Sequence[EditExample],
    seed: int,
    read: HistoryRead,
    count: int,
    known: Collection[str] = (),
) -> HistoryRead:
    """Where the chain stands once `count` more examples of `history_laps` are read: the keys of
    the lap it is then in that belong to `examples` (an example gone from the history is
    forgotten)."""
    lap, keys = read.lap, set(read.keys)
    laps = history_laps(examples, seed, read, known)
    for _, (at, example) in zip(range(count), laps, strict=False):
        if at != lap:
            lap, keys = at, set()
        keys.add(example.key)
    present = {example.key for example in examples}
    return HistoryRead(lap, frozenset(keys & present))


def stream_edit_examples(examples: Sequence[EditExample], seed: int) -> Iterator[FimExample]:
    """`history_laps`' examples from the first lap, as the trainer takes them."""
    for _, example in history_laps(examples, seed):
        yield example.fim()


def live_laps(examples: Sequence[EditExample], seed: int) -> Iterator[EditExample]:
    """The server's own examples (newest first): the first lap in that order, so a budget that
    ends early has spent itself on the newest, then lap after lap in a seeded order."""
    if not examples:
        return
    yield from examples
    for _, example in history_laps(examples, seed):
        yield example


def stream_live_edits(examples: Sequence[EditExample], seed: int) -> Iterator[FimExample]:
    """`live_laps`' examples, as the trainer takes them."""
    for example in live_laps(examples, seed):
        yield example.fim()


def write_edit_training(adapter: Path, record: dict[str, Any]) -> None:
    """Say in an adapter directory what history it was trained on."""
    (adapter / EDIT_TRAINING_FILE).write_text(json.dumps(record, indent=2) + "\n")


def read_edit_training(adapter: Path) -> dict[str, Any] | None:
    """What history an adapter was trained on (None: not trained by `tabloop train edits`)."""
    try:
        found = json.loads((adapter / EDIT_TRAINING_FILE).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
