"""`NextEditPredictor`: the next edit near the cursor, from the recent edits, on a model runner.

    predictor = NextEditPredictor(runner, settings)
    prediction = predictor.predict(text, path, (line, character), history, cancel)
    prediction.edits  # [] means no change; else the edits, sorted, in document coordinates

"No change" is the common answer and costs no model call: without an edit in this document in
the last `recent_s` seconds whose region lies within `window_lines` lines of the cursor, or when
the cursor's line alone is past the window's token budget, `predict` answers at once; so it does
when the screen (`completion.next_edit.screen`) puts the chance of an edit inside the window
below `screen_below`. Otherwise the model rewrites the window greedily (with the window as the
draft when the runner can check one, `completion.runners.base.DraftRunner`), at most the
window's tokens plus `margin_tokens`, stopping at `<|file_sep|>`; the rewrite is diffed into
edits and checked by the guards of `completion.next_edit.diff`.

`predict` runs on the model thread (it calls the runner) and raises `completion.types.Cancelled`
when `cancel` is set before it is done.

A predictor made with `keep=N` keeps its last N rewrites by what determines them (the runner's
model and adapter, the prompt, the window, the token limit and the stop rule) and answers the
same prompt again from them: the server computes the prediction that accepting a shown one leads
to ahead, while the user reads it, and the request that follows is then answered without a model
call (`timings.reused`). Greedy decoding makes the kept rewrite the one the model would write.
Evaluations keep none, so every point they time calls the model.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from completion.next_edit.diff import Edit, reverts, undoes, window_edits, writes_outside
from completion.next_edit.history import EditEvent, EditHistory
from completion.next_edit.prompt import (
    FILE_SEP,
    Window,
    build_prompt,
    history_blocks,
    next_event_prefix,
    original_window,
    settings_window,
)
from completion.next_edit.screen import EditScreen, load_screen, screen_features
from completion.next_edit.settings import NextEditSettings
from completion.next_edit.text import document_lines
from completion.runners.base import ModelRunner, RunnerCapabilities
from completion.types import Cancelled, CancelToken, Generation, StopRule

STOP_TEXTS = (FILE_SEP, "<|endoftext|>")

FENCE = "```"
"""A Markdown code fence. A rewrite that opens one at the start of a line, in a window that has
none, has left the code: it is cut there (`stop_rule`)."""

MARKDOWN_SUFFIXES = (".md", ".markdown", ".mdx", ".rmd", ".qmd")
"""Documents where a fence is text the user may write, so it does not end a rewrite."""

Reason = Literal[
    "predicted",  # edits to show
    "no_history",  # no edit in this document yet (no model call)
    "no_recent_edit",  # the latest edit is too old or too far from the cursor (no model call)
    "no_window",  # the cursor's line alone is past the token budget (no model call)
    "unlikely",  # the screen puts an edit in the window below its threshold (no model call)
    "no_change",  # the model kept the window as it is
    "empty",  # the model wrote nothing for the window
    "truncated",  # the rewrite ran out of tokens before it ended
    "outside_window",  # refused: it would write past the window
    "undo",  # refused: it puts the user's latest edit, or a recent one here, back as it was
]
"""Why a prediction has the edits it has; only `predicted` has any."""


@dataclass
class NextEditTimings:
    """Where the time of one prediction went (milliseconds), and its sizes."""

    window_ms: float = 0.0
    screen_ms: float = 0.0
    prompt_ms: float = 0.0
    model_ms: float = 0.0
    diff_ms: float = 0.0
    total_ms: float = 0.0
    window_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    """Of the prompt's tokens, those the runner kept from before (a pre-read, an earlier
    prompt) and did not compute."""
    new_tokens: int = 0
    draft_tokens: int = 0
    draft_accepted: int = 0
    reached_model: bool = False
    reused: bool = False
    """The rewrite is one kept from an earlier call with the same prompt (no model call)."""


@dataclass
class NextEditPrediction:
    """The predicted edits ([] for no change), the window the model saw, and why."""

    edits: list[Edit]
    window: Window | None
    reason: Reason
    timings: NextEditTimings = field(default_factory=NextEditTimings)
    predicted: str = ""
    """The window's predicted text (empty when the model was not asked)."""
    generation: Generation | None = None
    screen: float | None = None
    """The screen's chance of an edit in the window (None when it did not look)."""


class NextEditPredictor:
    """Predicts the next edit on `runner` (a Qwen2.5-Coder-family base model, or one trained
    on the same prompt)."""

    def __init__(
        self, runner: ModelRunner, settings: NextEditSettings | None = None, *, keep: int = 0
    ) -> None:
        self.runner = runner
        self.settings = settings or NextEditSettings()
        self.model_calls = 0
        self.keep = keep
        self._kept: OrderedDict[tuple[object, ...], Generation] = OrderedDict()

    def screen(self) -> EditScreen | None:
        """The screen the settings name (None when `screen_below` is 0: the model decides)."""
        if self.settings.screen_below <= 0:
            return None
        return load_screen(self.settings.screen_weights)

    def predict(
        self,
        text: str | Sequence[str],
        path: str,
        cursor: tuple[int, int],
        history: EditHistory,
        cancel: CancelToken | None = None,
        *,
        now: float | None = None,
    ) -> NextEditPrediction:
        """The next edit in document `path` (its text, or its LSP lines with their breaks) for
        the cursor at (line, character); `history` holds the workspace's recent edits, recorded
        under the same `path`. Raises `Cancelled` when `cancel` is set before the answer."""
        started = time.perf_counter()
        cancel = cancel or CancelToken()
        settings = self.settings
        timings = NextEditTimings()

        def answer(
            reason: Reason, window: Window | None = None, **found: object
        ) -> NextEditPrediction:
            timings.total_ms = (time.perf_counter() - started) * 1000
            prediction = NextEditPrediction([], window, reason, timings)
            for name, value in found.items():
                setattr(prediction, name, value)
            return prediction

        quick = self.quick_answer(path, cursor, history, now=now)
        if quick is not None:
            return quick
        latest = history.latest(path)
        line = cursor[0]
        lines = document_lines(text)
        window = settings_window(lines, line, settings, self.runner.count_tokens)
        timings.window_ms = (time.perf_counter() - started) * 1000
        if window is None:
            return answer("no_window")
        timings.window_tokens = window.tokens
        screen = self.screen()
        chance: float | None = None
        if screen is not None and latest is not None:
            screen_started = time.perf_counter()
            chance = screen.probability(
                screen_features(lines, window, line, latest, history.events())
            )
            timings.screen_ms = (time.perf_counter() - screen_started) * 1000
            if chance < settings.screen_below:
                return answer("unlikely", window, screen=chance)
        cancel.raise_if_cancelled()

        prompt_started = time.perf_counter()
        prompt = self.prompt(path, window, history, latest)
        timings.prompt_ms = (time.perf_counter() - prompt_started) * 1000
        fences = fences_end_rewrites(path)
        generation = self._generate(prompt, window, cancel, timings, fences)
        predicted = rewritten_window(generation.text, window.text, fences_end=fences)
        if generation.stop_reason == "length":
            return answer(
                "truncated", window, predicted=predicted, generation=generation, screen=chance
            )
        if not predicted and window.text:
            return answer("empty", window, generation=generation, screen=chance)

        diff_started = time.perf_counter()
        edits = window_edits(window, predicted)
        reason: Reason = "predicted"
        if not edits:
            reason = "no_change"
        elif writes_outside(window, edits, lines):
            reason = "outside_window"
        elif undoes(window, predicted, latest) or reverts(
            window.text, predicted, [e for e in history.in_document(path) if e.complete]
        ):
            reason = "undo"
        timings.diff_ms = (time.perf_counter() - diff_started) * 1000
        found = answer(reason, window, predicted=predicted, generation=generation, screen=chance)
        if reason == "predicted":
            found.edits = edits
        return found

    def quick_answer(
        self,
        path: str,
        cursor: tuple[int, int],
        history: EditHistory,
        *,
        now: float | None = None,
    ) -> NextEditPrediction | None:
        """ "No change" when the history alone says so (no edit in `path`, or the latest one too
        old or too far from the cursor), else None. Reads no text and no tokenizer: cheap
        enough for the editor's event loop."""
        started = time.perf_counter()
        latest = history.latest(path)
        reason: Reason | None = None
        if latest is None:
            reason = "no_history"
        else:
            now = history.clock() if now is None else now
            line, radius = cursor[0], self.settings.window_lines
            if (
                now - latest.last_at > self.settings.recent_s
                or line < latest.start - radius
                or line > latest.end - 1 + radius
            ):
                reason = "no_recent_edit"
        if reason is None:
            return None
        timings = NextEditTimings(total_ms=(time.perf_counter() - started) * 1000)
        return NextEditPrediction([], None, reason, timings)

    def prompt(
        self, path: str, window: Window, history: EditHistory, latest: EditEvent | None
    ) -> str:
        """The prompt for `window` of document `path` (`completion.next_edit.prompt`)."""
        settings = self.settings
        blocks = history_blocks(
            history.events(),
            max_events=settings.history_events,
            max_tokens=settings.history_tokens,
            count_tokens=self.runner.count_tokens,
        )
        return build_prompt(path, blocks, original_window(window, latest), window)

    def prompt_start(self, events: Sequence[EditEvent]) -> str:
        """The start of the prompt of a prediction in an event after `events`
        (`completion.next_edit.prompt.next_event_prefix`): the server reads it ahead."""
        settings = self.settings
        return next_event_prefix(
            events,
            max_events=settings.history_events,
            max_tokens=settings.history_tokens,
            count_tokens=self.runner.count_tokens,
        )

    def _generate(
        self,
        prompt: str,
        window: Window,
        cancel: CancelToken,
        timings: NextEditTimings,
        fences_end: bool,
    ) -> Generation:
        model_started = time.perf_counter()
        timings.reached_model = True
        max_new_tokens = window.tokens + self.settings.margin_tokens
        runner = self.runner
        adapter = getattr(runner, "adapter", None)
        key = (runner.model_id, str(adapter), prompt, window.text, max_new_tokens, fences_end)
        generation = self._kept.get(key) if self.keep else None
        if generation is not None:
            self._kept.move_to_end(key)
            timings.reused = True
        else:
            generation = rewrite(
                runner,
                prompt,
                window.text,
                max_new_tokens=max_new_tokens,
                cancel=cancel,
                fences_end=fences_end,
            )
            self.model_calls += 1
        timings.model_ms = (time.perf_counter() - model_started) * 1000
        timings.prompt_tokens = generation.prompt_tokens
        timings.cached_tokens = 0 if timings.reused else generation.reused_tokens
        timings.new_tokens = generation.new_tokens
        timings.draft_tokens = generation.draft_tokens
        timings.draft_accepted = generation.draft_accepted
        if generation.stop_reason == "cancelled" or cancel.cancelled:
            raise Cancelled(cancel.reason or "cancelled")
        if self.keep and not timings.reused:
            self._kept[key] = generation
            while len(self._kept) > self.keep:
                self._kept.popitem(last=False)
        return generation


def rewrite(
    runner: ModelRunner,
    prompt: str,
    current: str,
    *,
    max_new_tokens: int,
    cancel: CancelToken | None = None,
    fences_end: bool = True,
) -> Generation:
    """The model's greedy rewrite of the window `current` after `prompt` (which ends where the
    updated window begins), stopping where `stop_rule` says: with `current` as the draft when
    the runner checks drafts (speculative edits: the same output in fewer forward passes), else
    decoded plainly."""
    drafts = RunnerCapabilities.of(runner).drafts
    cancel = cancel or CancelToken()
    stop = stop_rule(current, fences_end=fences_end)
    if drafts is not None:
        return drafts.generate_with_draft(
            prompt, draft=current, max_new_tokens=max_new_tokens, stop=stop, cancel=cancel
        )
    return runner.generate(prompt, max_new_tokens=max_new_tokens, stop=stop, cancel=cancel)


def fences_end_rewrites(path: str) -> bool:
    """Whether a code fence ends a rewrite in document `path` (all but Markdown documents)."""
    return not path.lower().endswith(MARKDOWN_SUFFIXES)


def stop_rule(current: str, *, fences_end: bool = True) -> StopRule:
    """Where a rewrite of the window `current` ends: at `<|file_sep|>` (or end of text), and,
    with `fences_end` (the predictor's for documents other than Markdown) where no line of
    `current` starts with a code fence, at the start of a line that does. A base model asked for
    the updated window sometimes closes it as a chat answer would, with a fence and prose after
    it, and the fence alone added after the window was a third of its shown edits on the click
    replay (27 → 18 with this rule). Cut there, the rewrite is what came before, and decoding
    stops at once."""
    fences_end = fences_end and not (current.startswith(FENCE) or f"\n{FENCE}" in current)

    def stop(text: str) -> int | None:
        found = [index for marker in STOP_TEXTS if (index := text.find(marker)) >= 0]
        if fences_end:
            if text.startswith(FENCE):
                found.append(0)
            elif (index := text.find(f"\n{FENCE}")) >= 0:
                found.append(index + 1)
        return min(found) if found else None

    return stop


def rewritten_window(output: str, current: str, *, fences_end: bool = True) -> str:
    """The model's rewrite as the window's text: cut where `stop_rule` says (or at the start of
    a stop text at its end), its line breaks those of `current` (the window now), and no line
    break added where the window has none at its end (the document's end)."""
    cut = stop_rule(current, fences_end=fences_end)(output)
    predicted = output if cut is None else output[:cut]
    if cut is None:
        # A server that cuts at a stop text may have sent its first characters already.
        for stop in STOP_TEXTS:
            partial = next(
                (k for k in range(len(stop) - 1, 1, -1) if predicted.endswith(stop[:k])), 0
            )
            predicted = predicted[: len(predicted) - partial]
    if "\r\n" in current and "\r\n" not in predicted:
        predicted = predicted.replace("\n", "\r\n")
    if not current.endswith(("\n", "\r")):
        for end in ("\r\n", "\n", "\r"):
            if predicted.endswith(end):
                predicted = predicted[: -len(end)]
                break
    return predicted
