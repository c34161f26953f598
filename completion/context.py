"""What the model sees: prefix, suffix and snippets from elsewhere, under a token budget.

Shares of the prompt budget are counted with the model's own tokenizer. Budget the snippets or
the suffix leave unused goes to the prefix, and what the prefix leaves (it starts on an anchor
line, below) goes to snippets.

The prefix window starts on an *anchor* line (a multiple of `ANCHOR_LINES` from the top of the
file) rather than at the first line that fits: while the user types, the start of the prompt then
stays put for many keystrokes, and the runner's KV-prefix cache keeps matching.
"""

from __future__ import annotations

import builtins
import keyword
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from completion.settings import CompletionSettings
from completion.types import CompletionRequest, Generation, Snippet, StopRule

ANCHOR_LINES = 16
# No token is longer than this many characters in practice (long runs of indentation are the
# longest); text beyond `budget * MAX_TOKEN_CHARS` characters cannot fit, so it is never tokenized.
MAX_TOKEN_CHARS = 10

TokenCounter = Callable[[str], int]


class ContextSource(Protocol):
    """Finds snippets from other places in the workspace for a request."""

    def snippets(self, request: CompletionRequest, deadline: float) -> Sequence[Snippet]:
        """Snippets, best first. `deadline` is a `time.monotonic()` value to finish by."""
        ...


@runtime_checkable
class NamedRepository(Protocol):
    """A context source that knows the name of the repository it searches (the prompt's
    `<|repo_name|>` for models with a repository-level format)."""

    @property
    def repo_name(self) -> str: ...


@dataclass(frozen=True)
class ContextBudget:
    """Token budget of one prompt, split in shares."""

    total: int
    prefix_share: float = 0.8
    suffix_share: float = 0.1
    snippet_share: float = 0.0

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


class LineTokenCounter:
    """Token counts per line, remembered: between keystrokes only the edited line is new.

    A text's count is taken as the sum of its lines' counts. Tokens seldom span a line break,
    so the sum is within a few tokens of the exact count; the runner tokenizes the final prompt
    itself, and budgets are not that precise.
    """

    def __init__(self, count: TokenCounter, max_lines: int = 20_000) -> None:
        self.count = count
        self.max_lines = max_lines
        self._known: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def lines(self, lines: Sequence[str]) -> list[int]:
        counts = []
        with self._lock:
            for line in lines:
                known = self._known.get(line)
                if known is None:
                    known = self._known[line] = self.count(line)
                    if len(self._known) > self.max_lines:
                        self._known.popitem(last=False)
                counts.append(known)
        return counts

    def __call__(self, text: str) -> int:
        return sum(self.lines(text.splitlines(keepends=True)))


def fit_suffix(suffix: str, budget: int, counter: LineTokenCounter) -> tuple[str, int]:
    """The longest run of whole lines from the start of `suffix` that fits in `budget` tokens.

    The cursor's own line is kept even when it alone is over budget (cut by characters then).
    Only the first `budget * MAX_TOKEN_CHARS` characters are looked at.
    """
    if budget <= 0 or not suffix:
        return "", 0
    window = suffix[: budget * MAX_TOKEN_CHARS]
    lines = window.splitlines(keepends=True)
    if len(window) < len(suffix) and len(lines) > 1:
        lines = lines[:-1]  # the window may end mid-line
    used = 0
    kept = 0
    for tokens in counter.lines(lines):
        if used + tokens > budget:
            break
        used += tokens
        kept += 1
    if kept == 0:
        cut = _fit_chars(lines[0], budget, counter.count, from_end=False)
        return cut, counter.count(cut)
    return "".join(lines[:kept]), used


def fit_prefix(prefix: str, budget: int, counter: LineTokenCounter) -> tuple[str, int]:
    """The end of `prefix` that fits in `budget` tokens, starting on an anchor line if it can.

    Only the last `budget * MAX_TOKEN_CHARS` characters are looked at, so the cost does not grow
    with the size of the file.
    """
    if budget <= 0 or not prefix:
        return "", 0
    window_start = max(0, len(prefix) - budget * MAX_TOKEN_CHARS)
    if window_start > 0:
        # Start the window on a line boundary: only whole lines are candidates.
        newline = prefix.find("\n", window_start)
        window_start = newline + 1 if newline >= 0 else window_start
    first_line = prefix.count("\n", 0, window_start)  # line number of the window's first line
    lines = prefix[window_start:].splitlines(keepends=True)
    counts = counter.lines(lines)
    # Tokens from each line to the end, then the first anchor line whose tail fits.
    tails = [0] * (len(lines) + 1)
    for i in range(len(lines) - 1, -1, -1):
        tails[i] = tails[i + 1] + counts[i]
    if window_start == 0 and tails[0] <= budget:
        return prefix, tails[0]
    fitting = [i for i in range(len(lines)) if tails[i] <= budget]
    anchored = [i for i in fitting if (first_line + i) % ANCHOR_LINES == 0]
    for start in anchored[:1] or fitting[:1]:
        text = "".join(lines[start:])
        if text.strip():
            return text, tails[start]
    # The cursor's line alone is over budget: its end, by characters.
    text = _fit_chars(lines[-1] if lines else prefix, budget, counter.count, from_end=True)
    return text, counter.count(text)


def _fit_chars(text: str, budget: int, count: TokenCounter, *, from_end: bool) -> str:
    """The longest start (or end) of one line that fits: only for a line over budget alone."""
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
    snippets: Sequence[Snippet], budget: int, count: TokenCounter, heads: bool = False
) -> tuple[list[Snippet], int]:
    """Snippets in order of preference while they fit; duplicates of one text are dropped.

    With `heads`, a definition too long for what is left is cut to its first lines that fit
    (its signature, the start of its docstring) instead of being left out: how a name is called
    is most of what a definition tells the code that uses it.
    """
    chosen: dict[int, Snippet] = {}
    used = _fill(snippets, budget, count, heads, chosen)
    return [chosen[i] for i in sorted(chosen)], used


def _fill(
    snippets: Sequence[Snippet],
    budget: int,
    count: TokenCounter,
    heads: bool,
    chosen: dict[int, Snippet],
) -> int:
    """Add to `chosen` (by position in `snippets`) those not yet in it that fit in `budget`
    tokens, in order; returns the tokens they cost."""
    seen = {snippets[i].text for i in chosen}
    used = 0
    for position, snippet in enumerate(snippets):
        if position in chosen or snippet.text in seen or not snippet.text.strip():
            continue
        # The path header and separator cost tokens too.
        header = count(snippet.path + "\n") + 2
        cost = header + count(snippet.text)
        seen.add(snippet.text)
        if used + cost > budget:
            if not heads or snippet.source != "definition":
                continue
            head, head_cost = _head(snippet.text, budget - used - header, count)
            if not head:
                continue
            snippet, cost = replace(snippet, text=head), header + head_cost
        chosen[position] = snippet
        used += cost
    return used


def _head(text: str, budget: int, count: TokenCounter) -> tuple[str, int]:
    """The first whole lines of `text` that fit in `budget` tokens, and their cost."""
    kept: list[str] = []
    used = 0
    for line in text.splitlines(keepends=True):
        cost = count(line)
        if used + cost > budget:
            break
        kept.append(line)
        used += cost
    return "".join(kept), used


def assemble(
    request: CompletionRequest,
    budget: ContextBudget,
    *,
    count_tokens: LineTokenCounter,
    source: ContextSource | None = None,
    deadline_s: float = 0.05,
    min_similarity: float = 0.0,
    definition_heads: bool = False,
) -> PromptParts:
    """Prefix, suffix and snippets for `request`, each within its share of `budget`; snippets
    also get what the prefix leaves of its budget (it starts on an anchor line).

    Snippets found by similarity (`source == "index"`) below `min_similarity` are left out:
    loosely related code costs prompt tokens and leads the model astray. Definitions of names
    used near the cursor and recent edits are kept whatever their score; with
    `definition_heads`, a definition too long for the share is cut to its first lines.
    """
    suffix, suffix_used = fit_suffix(request.suffix, budget.suffix_tokens, count_tokens)
    if source is None:
        prefix, prefix_used = fit_prefix(
            request.prefix, budget.prefix_tokens(suffix_used, 0), count_tokens
        )
        return PromptParts(prefix, suffix, [], prefix_used, suffix_used, 0)
    found = [
        snippet
        for snippet in source.snippets(request, time.monotonic() + deadline_s)
        if snippet.source != "index" or snippet.score >= min_similarity
    ]
    chosen: dict[int, Snippet] = {}
    snippet_used = _fill(found, budget.snippet_tokens, count_tokens, definition_heads, chosen)
    prefix, prefix_used = fit_prefix(
        request.prefix, budget.prefix_tokens(suffix_used, snippet_used), count_tokens
    )
    # The prefix starts on an anchor line, so it seldom fills its budget: what it leaves goes to
    # the snippets, at no cost to the code around the cursor. The cursor's line is left out of
    # the reckoning, so the snippets (the start of the prompt, and with it the runner's KV cache)
    # stay the same while the user types on it; the prompt may go over by that line.
    cursor_line = count_tokens(request.line_prefix) if prefix.endswith(request.line_prefix) else 0
    slack = budget.total - suffix_used - snippet_used - (prefix_used - cursor_line)
    if slack > 0:
        snippet_used += _fill(found, slack, count_tokens, definition_heads, chosen)
    snippets = [chosen[i] for i in sorted(chosen)]
    return PromptParts(prefix, suffix, snippets, prefix_used, suffix_used, snippet_used)


# A partial token at the end of the cursor's line: a run of word characters, or of operator
# characters (a dot included, for dotted names).
_PARTIAL_TOKEN = re.compile(r"(?:\w+|[=<>!+\-*/%&|^~@:.]+)$")
_WORD_CHAR = re.compile(r"\w")
_PYTHON_WORDS = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | frozenset(dir(builtins))
# The longest typed fragment the model is made to write again; a longer word is left as it is.
MAX_HEAL_CHARS = 48


@dataclass(frozen=True)
class TypedTail:
    """Text the user typed at the end of the cursor's line, left out of the prompt and written by
    the model again: the prompt then ends where the model's training data had token boundaries.

    Two cases, one mechanism:

    - *indentation* on an otherwise empty line (`forced` false). A prompt that ends in
      indentation cuts the model's own first token (the indent) in two, and models then often
      write more whitespace before the code. The prompt ends at the line break, the model writes
      the line's indentation itself, and its indentation is taken off the output again; when it
      differs from the typed one, the typed one stands.
    - a *partial token* (`forced` true: `if isinst`, `os.pa`, `x <`): the fragment, with the one
      character before it that tokenizers join to a word (a space, a dot, a bracket), or from the
      line start when only indentation precedes it. The runner must write `text` exactly before
      anything else (`completion.healing`), so its first token may complete the word
      (`" isinstance"`), and `text` is taken off its output: the suggestion starts at the cursor.
      When the fragment ends in a word that the file never uses whole and that is not a keyword
      or builtin of Python (`hasattr(socke`), it is `unfinished_word`: the token that finishes
      the fragment must go on with a word character, so the model cannot take `socke` for the
      whole name and write on after it.
    """

    text: str
    forced: bool = False
    unfinished_word: bool = False

    def prompt_request(self, request: CompletionRequest) -> CompletionRequest:
        """The request whose prefix the prompt is built from: without the typed tail."""
        return replace(request, prefix=request.prefix[: len(request.prefix) - len(self.text)])

    def split(self, generated: str) -> tuple[str, int] | None:
        """The suggestion in `generated` and how many characters of it rewrote the typed tail;
        None while the model has written nothing beyond the tail yet."""
        if self.forced:
            if generated.startswith(self.text):
                return generated[len(self.text) :], len(self.text)
            if self.text.startswith(generated):
                return None
            # A runner that could not follow the constraint: nothing of its text fits.
            return "", len(generated)
        lead = generated[: len(generated) - len(generated.lstrip(" \t"))]
        if lead == generated:
            return None
        # The model's own indentation when it agrees with the typed one, else all of it: the
        # typed indentation stands and the code follows it.
        cut = len(self.text) if generated.startswith(self.text) else len(lead)
        return generated[cut:], cut

    def stop(self, rule: StopRule) -> StopRule:
        """`rule` (written for the suggestion after the cursor) for the model's raw output."""

        def healed(generated: str) -> int | None:
            parts = self.split(generated)
            if parts is None:
                return None
            body, cut = parts
            if self.forced and not generated.startswith(self.text):
                return 0  # diverged: nothing to keep
            inner = rule(body)
            return None if inner is None else cut + inner

        return healed

    def heal(self, generation: Generation) -> Generation:
        """The generation as if the prompt had ended at the cursor.

        Typed indentation is one token of the output in the usual case: its log-probability is
        dropped, so the confidence features judge the code. A rewritten partial token's first
        token also holds what completes the word, so its log-probability stays.
        """
        parts = self.split(generation.text)
        if parts is None:
            return replace(generation, text="")
        body, cut = parts
        logprobs = generation.token_logprobs
        if cut and len(logprobs) > 1 and not self.forced:
            logprobs = logprobs[1:]
        return replace(generation, text=body, token_logprobs=list(logprobs))


# The indentation-only case keeps its name for readers of older code and docs.
TypedIndent = TypedTail


def typed_tail(
    request: CompletionRequest, *, indentation: bool = True, partial_tokens: bool = False
) -> TypedTail | None:
    """What to leave out of the prompt at the end of the cursor's line, or None.

    `indentation`: the line before the cursor when it is indentation only. `partial_tokens`: a
    word or operator fragment that ends at the cursor (the model must write it again).
    """
    line_prefix = request.line_prefix
    if not line_prefix:
        return None
    if not line_prefix.strip(" \t"):
        return TypedTail(line_prefix) if indentation else None
    if not partial_tokens:
        return None
    match = _PARTIAL_TOKEN.search(line_prefix)
    if match is None:
        return None
    start = match.start()
    before = line_prefix[:start]
    if not before.strip(" \t"):
        start = 0 if indentation else start
    elif not before[-1].isalnum():
        start -= 1  # the space, dot or bracket a tokenizer joins to the word
    text = line_prefix[start:]
    # Every tokenizer has a token for each ASCII character, so ASCII text can always be spelled.
    if len(text) > MAX_HEAL_CHARS or not text.isascii():
        return None
    word = match.group()
    unfinished = _WORD_CHAR.match(word[-1]) is not None and not _complete_word(word, request)
    return TypedTail(text, forced=True, unfinished_word=unfinished)


def _complete_word(word: str, request: CompletionRequest) -> bool:
    """Whether `word`, typed just before the cursor, may be a whole word: the file uses it whole
    elsewhere, or it is one of Python's keywords or builtins (in a Python file)."""
    if request.language == "python" and word in _PYTHON_WORDS:
        return True
    if word[0].isdigit():
        return True  # a number: any length is whole
    whole = re.compile(rf"(?<!\w){re.escape(word)}(?!\w)")
    before = request.prefix[: len(request.prefix) - len(word)]
    return whole.search(before) is not None or whole.search(request.suffix) is not None


def typed_indent(request: CompletionRequest) -> TypedTail | None:
    """The indentation to leave out of the prompt: the cursor's line before the cursor, when
    that is indentation only (None otherwise)."""
    return typed_tail(request, indentation=True, partial_tokens=False)
