"""The gate's features: what one show/silence decision is judged on, raw and as a vector.

`extract_features` runs at serving time and its raw values are logged with each decision; the
trainer reads them back and vectorises them with the same `FeatureSpace`, so a feature means the
same thing on both sides.

Features come from the request's shape and the generated suggestion only, never from code text:
model confidence, suggestion size, where the cursor sits, the language, and what the server knows
about the user (`Signals`). A policy's own `FeatureSpace` (clipping, log transforms, one-hot
lists) travels inside its artefact, so an old policy keeps reading the features it was trained on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from common.languages import BY_ID
from completion.types import CompletionRequest, Generation


def _lsp_ids(*ids: str) -> tuple[str, ...]:
    """`ids` unchanged, after checking that each is an LSP id of the one language table."""
    unknown = [lsp_id for lsp_id in ids if lsp_id not in BY_ID]
    if unknown:
        raise ValueError(f"gate languages missing from common.languages: {unknown}")
    return ids


# The LSP language ids the gate tells apart, a subset of `common.languages`; every other language
# is `other`. The order and membership are the default feature space's one-hot columns: changing
# them changes the feature space (old artefacts keep their own stored list, new ones get the new
# one), so a language added to the table is not added here by itself.
LANGUAGES = _lsp_ids(
    "python",
    "javascript",
    "typescript",
    "typescriptreact",
    "javascriptreact",
    "go",
    "rust",
    "java",
    "c",
    "cpp",
    "csharp",
    "ruby",
    "php",
    "lua",
    "shellscript",
)
OTHER = "other"
CLOSERS = frozenset(")]}>\"'`;,")
# The first tokens decide whether a suggestion starts right, which is what a user judges first.
HEAD_TOKENS = 3
BLOCK_OPENERS = (":", "{", "(", "[", "=>", "->")
FeatureValue = float | str
Features = Mapping[str, FeatureValue]


@dataclass(frozen=True)
class Signals:
    """What the server knows about the user and the request beyond the text."""

    typing_speed_cps: float = 0.0
    seconds_since_last_accept: float = 1e6
    recent_accept_rate: float = 0.0
    retrieval_found: bool = False
    retrieval_similarity: float = 0.0
    cache_hit: bool = False


def _indent_width(line: str) -> int:
    """Columns of leading whitespace, a tab reaching the next multiple of 4."""
    lead = line[: len(line) - len(line.lstrip(" \t"))]
    return len(lead.expandtabs(4))


def _previous_code_line(prefix: str) -> str:
    """The last non-blank line before the cursor's line."""
    lines = prefix.split("\n")[:-1]
    for line in reversed(lines):
        if line.strip():
            return line
    return ""


def _repeats_suffix(text: str, suffix: str) -> bool:
    """Whether the suggestion's first line already stands in the next lines after the cursor.

    Models often re-emit the code that follows; showing it would duplicate it.
    """
    first = next((line.strip() for line in text.split("\n") if line.strip()), "")
    if len(first) < 4:
        return False
    following = [line.strip() for line in suffix.split("\n")[:6]]
    return first in following


def extract_features(
    request: CompletionRequest,
    text: str,
    generation: Generation | None,
    signals: Signals,
    *,
    syntax: str = "unchecked",
) -> dict[str, float | str]:
    """The raw features of one decision: the same function at serving and at training time.

    `text` is the post-processed suggestion (empty when there is none); `syntax` is what the
    syntax check in place did to it (`completion.syntax`: kept, cut, dropped, unchecked). Values
    are raw
    (character counts, seconds); the policy's `FeatureSpace` clips and transforms them.
    """
    logprobs = [lp for lp in (generation.token_logprobs if generation else []) if math.isfinite(lp)]
    line_prefix = request.line_prefix
    line_suffix = request.line_suffix
    after = line_suffix.strip()
    before = line_prefix.rstrip()
    previous = _previous_code_line(request.prefix)
    opener_line = before if before else previous.rstrip()
    prefix_lines = request.prefix.count("\n")
    total_lines = prefix_lines + request.suffix.count("\n") + 1
    language = request.language.lower() if request.language.lower() in LANGUAGES else OTHER
    head = logprobs[:HEAD_TOKENS]
    return {
        "language": language,
        "logprob_mean": sum(logprobs) / len(logprobs) if logprobs else 0.0,
        "logprob_min": min(logprobs) if logprobs else 0.0,
        "logprob_first": logprobs[0] if logprobs else 0.0,
        "logprob_head_min": min(head) if head else 0.0,
        "has_logprobs": 1.0 if logprobs else 0.0,
        "generated_tokens": float(len(logprobs)),
        "truncated": 1.0 if generation is not None and generation.stop_reason == "length" else 0.0,
        "suggestion_chars": float(len(text)),
        "suggestion_lines": float(text.count("\n") + 1) if text else 0.0,
        "repeats_suffix": 1.0 if text and _repeats_suffix(text, request.suffix) else 0.0,
        "leading_whitespace": 1.0 if text[:1] in (" ", "\t") else 0.0,
        "extra_indent": 1.0 if text[:1] in (" ", "\t") and not line_prefix.strip() else 0.0,
        "code_after_cursor": 1.0 if after and not set(after) <= CLOSERS else 0.0,
        "closers_after_cursor": 1.0 if after and set(after) <= CLOSERS else 0.0,
        "cursor_column": float(len(line_prefix)),
        "indent_depth": _indent_width(line_prefix if line_prefix.strip() else previous) / 4.0,
        "at_line_start": 0.0 if line_prefix.strip() else 1.0,
        "mid_word": 1.0 if line_prefix[-1:].isalnum() or line_prefix[-1:] == "_" else 0.0,
        "after_dot": 1.0 if line_prefix.endswith(".") else 0.0,
        "after_block_opener": 1.0 if opener_line.endswith(BLOCK_OPENERS) else 0.0,
        "file_position": prefix_lines / total_lines,
        "invoked": 1.0 if request.trigger == "invoked" else 0.0,
        "typing_speed_cps": float(signals.typing_speed_cps),
        "seconds_since_last_accept": float(signals.seconds_since_last_accept),
        "recent_accept_rate": float(signals.recent_accept_rate),
        "retrieval_found": 1.0 if signals.retrieval_found else 0.0,
        "retrieval_similarity": float(signals.retrieval_similarity),
        "cache_hit": 1.0 if signals.cache_hit else 0.0,
        "syntax_cut": 1.0 if syntax == "cut" else 0.0,
    }


def is_empty(features: Features) -> bool:
    """Whether the decision had no suggestion at all (always silence, propensity 1)."""
    return _number(features.get("suggestion_chars", 0.0)) <= 0.0


def _number(value: object) -> float:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return math.nan


@dataclass(frozen=True)
class NumericFeature:
    """How one raw numeric feature becomes a model input: clip to [lo, hi], then transform."""

    name: str
    lo: float
    hi: float
    transform: Literal["identity", "log1p"] = "identity"

    def apply(self, raw: np.ndarray) -> np.ndarray:
        """Clip and transform a column of raw values; NaN (missing) stays NaN."""
        value = np.clip(raw, self.lo, self.hi)
        return np.log1p(value) if self.transform == "log1p" else value


DEFAULT_NUMERIC = (
    NumericFeature("logprob_mean", -20.0, 0.0),
    NumericFeature("logprob_min", -30.0, 0.0),
    NumericFeature("logprob_first", -30.0, 0.0),
    NumericFeature("logprob_head_min", -30.0, 0.0),
    NumericFeature("has_logprobs", 0.0, 1.0),
    NumericFeature("generated_tokens", 0.0, 1024.0, "log1p"),
    NumericFeature("truncated", 0.0, 1.0),
    NumericFeature("suggestion_chars", 0.0, 4096.0, "log1p"),
    NumericFeature("suggestion_lines", 0.0, 64.0, "log1p"),
    NumericFeature("repeats_suffix", 0.0, 1.0),
    NumericFeature("leading_whitespace", 0.0, 1.0),
    NumericFeature("extra_indent", 0.0, 1.0),
    NumericFeature("code_after_cursor", 0.0, 1.0),
    NumericFeature("closers_after_cursor", 0.0, 1.0),
    NumericFeature("cursor_column", 0.0, 400.0, "log1p"),
    NumericFeature("indent_depth", 0.0, 16.0),
    NumericFeature("at_line_start", 0.0, 1.0),
    NumericFeature("mid_word", 0.0, 1.0),
    NumericFeature("after_dot", 0.0, 1.0),
    NumericFeature("after_block_opener", 0.0, 1.0),
    NumericFeature("file_position", 0.0, 1.0),
    NumericFeature("invoked", 0.0, 1.0),
    NumericFeature("typing_speed_cps", 0.0, 50.0),
    NumericFeature("seconds_since_last_accept", 0.0, 86400.0, "log1p"),
    NumericFeature("recent_accept_rate", 0.0, 1.0),
    NumericFeature("retrieval_found", 0.0, 1.0),
    NumericFeature("retrieval_similarity", -1.0, 1.0),
    NumericFeature("cache_hit", 0.0, 1.0),
    # Added with the syntax check: policies trained before it keep their own space without it.
    NumericFeature("syntax_cut", 0.0, 1.0),
)


@dataclass(frozen=True)
class FeatureSpace:
    """Which features a policy reads, and how raw values become one input vector."""

    numeric: tuple[NumericFeature, ...] = DEFAULT_NUMERIC
    categorical: tuple[tuple[str, tuple[str, ...]], ...] = (("language", (*LANGUAGES, OTHER)),)

    @property
    def names(self) -> list[str]:
        names = [f.name for f in self.numeric]
        for key, values in self.categorical:
            names.extend(f"{key}={value}" for value in values)
        return names

    @property
    def dim(self) -> int:
        return len(self.numeric) + sum(len(values) for _, values in self.categorical)

    def row(self, features: Features) -> np.ndarray:
        """One raw input row (NaN where a numeric feature is missing: the normaliser fills it)."""
        return self.matrix([features])[0]

    def matrix(self, rows: Sequence[Features]) -> np.ndarray:
        """Raw input rows, computed a column at a time (the trainer featurises many)."""
        out = np.empty((len(rows), self.dim), dtype=np.float64)
        for j, spec in enumerate(self.numeric):
            try:
                raw = np.fromiter((f.get(spec.name, math.nan) for f in rows), np.float64, len(rows))
            except (TypeError, ValueError):  # a string or None where a number belongs
                raw = np.fromiter(
                    (_number(f.get(spec.name, math.nan)) for f in rows), np.float64, len(rows)
                )
            raw[np.isinf(raw)] = np.nan  # an infinite value is as unknown as a missing one
            out[:, j] = spec.apply(raw)
        j = len(self.numeric)
        for key, values in self.categorical:
            fallback = OTHER if OTHER in values else None
            chosen = [c if (c := f.get(key, OTHER)) in values else fallback for f in rows]
            for value in values:
                out[:, j] = [1.0 if c == value else 0.0 for c in chosen]
                j += 1
        return out
