"""The gate policy: whether to show a suggestion or stay silent.

One module serves the editor (the engine asks `Policy.decide`) and the trainer (which vectorises
logged features with the same `FeatureSpace`), so a feature means the same thing on both sides.

Features come from the request's shape and the generated suggestion only, never from code text:
model confidence, suggestion size, where the cursor sits, the language, and what the server knows
about the user (`Signals`). The raw values are logged with each decision; the policy's own
`FeatureSpace` (clipping, log transforms, one-hot lists) and `Normaliser` turn them into a vector,
and both travel inside the versioned policy artefact.

P(show) = floor + (1 - floor) * sigmoid(logit). The floor keeps a little exploration on suggestions
the policy would otherwise silence (silence is worth 0 for certain, so it needs none); the smooth
form keeps a gradient everywhere, which the trainer needs.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from completion.types import Action, CompletionRequest, Generation

ARTIFACT_FORMAT = "tabloop.policy/1"
DEFAULT_SHOW_FLOOR = 0.05
BUILTIN_VERSION = "builtin"

# LSP language ids we tell apart; everything else is `other`. Changing this list changes the
# feature space, so it is stored in every artefact and old policies keep their own list.
LANGUAGES = (
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


class PolicyError(Exception):
    """A policy artefact that cannot be trusted: malformed, or its checksum does not match."""


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
    request: CompletionRequest, text: str, generation: Generation | None, signals: Signals
) -> dict[str, float | str]:
    """The raw features of one decision: the same function at serving and at training time.

    `text` is the post-processed suggestion (empty when there is none). Values are raw
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

    def to_json(self) -> dict[str, Any]:
        return {
            "numeric": [
                {"name": f.name, "lo": f.lo, "hi": f.hi, "transform": f.transform}
                for f in self.numeric
            ],
            "categorical": {key: list(values) for key, values in self.categorical},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FeatureSpace:
        numeric = tuple(
            NumericFeature(str(f["name"]), float(f["lo"]), float(f["hi"]), f["transform"])
            for f in data["numeric"]
        )
        for spec in numeric:
            if spec.transform not in ("identity", "log1p"):
                raise PolicyError(f"unknown transform {spec.transform!r}")
        categorical = tuple(
            (str(key), tuple(str(v) for v in values)) for key, values in data["categorical"].items()
        )
        return cls(numeric, categorical)


@dataclass(frozen=True)
class Normaliser:
    """Standardisation of the input vector; missing values become the mean (0 after scaling)."""

    mean: tuple[float, ...]
    scale: tuple[float, ...]

    @classmethod
    def identity(cls, dim: int) -> Normaliser:
        return cls((0.0,) * dim, (1.0,) * dim)

    @classmethod
    def fit(cls, matrix: np.ndarray) -> Normaliser:
        """Mean and standard deviation per column (scale 1 for constant columns)."""
        mean = np.nan_to_num(np.nanmean(matrix, axis=0), nan=0.0) if len(matrix) else None
        if mean is None:
            return cls.identity(matrix.shape[1])
        std = np.nan_to_num(np.nanstd(matrix, axis=0), nan=0.0)
        std = np.where(std < 1e-6, 1.0, std)
        return cls(tuple(float(m) for m in mean), tuple(float(s) for s in std))

    def apply(self, matrix: np.ndarray) -> torch.Tensor:
        mean = np.asarray(self.mean)
        filled = np.where(np.isnan(matrix), mean, matrix)
        return torch.as_tensor((filled - mean) / np.asarray(self.scale), dtype=torch.float64)


class ShowModel(nn.Module):
    """Logit of showing: a logistic part plus an optional small tanh MLP (zero at the start)."""

    def __init__(self, dim: int, hidden: int = 0) -> None:
        super().__init__()
        self.dim = dim
        self.hidden = hidden
        # float64 throughout: the model is tiny, and a propensity such as 1 - P(show) near 0 must
        # come out the same for one row at serving time and for a batch at training time.
        self.linear = nn.Linear(dim, 1, dtype=torch.float64)
        self.mlp_in: nn.Linear | None = None
        self.mlp_out: nn.Linear | None = None
        if hidden:
            self.mlp_in = nn.Linear(dim, hidden, dtype=torch.float64)
            self.mlp_out = nn.Linear(hidden, 1, dtype=torch.float64)
            # Zero output: a new MLP starts as the logistic model it extends.
            nn.init.zeros_(self.mlp_out.weight)
            nn.init.zeros_(self.mlp_out.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logit = self.linear(x).squeeze(-1)
        if self.mlp_in is not None and self.mlp_out is not None:
            logit = logit + self.mlp_out(torch.tanh(self.mlp_in(x))).squeeze(-1)
        return logit

    def input_layers(self) -> list[nn.Linear]:
        """The layers that read the normalised input directly."""
        layers = [self.linear]
        if self.mlp_in is not None:
            layers.append(self.mlp_in)
        return layers


def _state_to_json(model: ShowModel) -> dict[str, Any]:
    return {name: tensor.detach().tolist() for name, tensor in model.state_dict().items()}


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


@dataclass
class Policy:
    """A versioned show/silence policy; immutable once built, so threads may share it."""

    version: str
    space: FeatureSpace
    normaliser: Normaliser
    model: ShowModel
    show_floor: float = DEFAULT_SHOW_FLOOR
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.model.eval()
        if not 0.0 <= self.show_floor <= 1.0:
            raise PolicyError(f"show floor {self.show_floor} outside [0, 1]")

    # -- evaluation ---------------------------------------------------------------------------

    def inputs(self, rows: Sequence[Features]) -> torch.Tensor:
        """Normalised model inputs for logged or live feature dicts."""
        return self.normaliser.apply(self.space.matrix(rows))

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of showing for normalised inputs (differentiable: the trainer calls this)."""
        return self.model(x)

    def show_probability(self, x: torch.Tensor) -> torch.Tensor:
        """P(show) for normalised inputs, with the exploration floor (differentiable)."""
        return self.show_floor + (1.0 - self.show_floor) * torch.sigmoid(self.logits(x))

    def p_show_batch(self, rows: Sequence[Features]) -> np.ndarray:
        """P(show) for many feature dicts; 0 where there is no suggestion."""
        if not rows:
            return np.zeros(0)
        with torch.inference_mode():
            p = self.show_probability(self.inputs(rows)).numpy()
        empty = np.fromiter((is_empty(f) for f in rows), dtype=bool, count=len(rows))
        return np.where(empty, 0.0, p)

    def intent_batch(self, rows: Sequence[Features]) -> np.ndarray:
        """P(show) without the exploration floor: what the policy would do if it did not explore."""
        if not rows:
            return np.zeros(0)
        with torch.inference_mode():
            p = torch.sigmoid(self.logits(self.inputs(rows))).numpy()
        empty = np.fromiter((is_empty(f) for f in rows), dtype=bool, count=len(rows))
        return np.where(empty, 0.0, p)

    def p_show(self, features: Features) -> float:
        """Probability of showing the suggestion these features describe."""
        return float(self.p_show_batch([features])[0])

    def decide(self, features: Features, rng: random.Random) -> tuple[Action, float]:
        """Draw the action; returns it with its propensity (the probability it had)."""
        p = self.p_show(features)
        if p <= 0.0:
            return "silence", 1.0
        if rng.random() < p:
            return "show", p
        return "silence", 1.0 - p

    # -- derivation ---------------------------------------------------------------------------

    def derive(
        self,
        version: str,
        *,
        normaliser: Normaliser | None = None,
        show_floor: float | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Policy:
        """A copy under a new version, optionally re-expressed over another normaliser.

        Re-normalising changes the input layers so the logit function stays exactly the same:
        w' = w * s'/s and b' = b + w . (m' - m)/s, which lets a candidate start from the serving
        policy while using statistics of newer data.
        """
        model = ShowModel(self.model.dim, self.model.hidden)
        model.load_state_dict(self.model.state_dict())
        target = normaliser or self.normaliser
        if target != self.normaliser:
            old_m = torch.tensor(self.normaliser.mean, dtype=torch.float64)
            old_s = torch.tensor(self.normaliser.scale, dtype=torch.float64)
            new_m = torch.tensor(target.mean, dtype=torch.float64)
            new_s = torch.tensor(target.scale, dtype=torch.float64)
            with torch.no_grad():
                for layer in model.input_layers():
                    w = layer.weight
                    layer.bias.copy_(layer.bias + w @ ((new_m - old_m) / old_s))
                    layer.weight.copy_(w * (new_s / old_s))
        return Policy(
            version=version,
            space=self.space,
            normaliser=target,
            model=model,
            show_floor=self.show_floor if show_floor is None else show_floor,
            metadata=dict(self.metadata if metadata is None else metadata),
        )

    def with_floor(self, show_floor: float) -> Policy:
        """The same policy with another exploration floor (the editor's setting)."""
        if show_floor == self.show_floor:
            return self
        return self.derive(self.version, show_floor=show_floor)

    # -- artefact -----------------------------------------------------------------------------

    def to_artifact(self) -> bytes:
        """The policy as a small, checksummed JSON document."""
        body = {
            "format": ARTIFACT_FORMAT,
            "version": self.version,
            "show_floor": self.show_floor,
            "features": self.space.to_json(),
            "normaliser": {
                "mean": list(self.normaliser.mean),
                "scale": list(self.normaliser.scale),
            },
            "model": {"hidden": self.model.hidden, "state": _state_to_json(self.model)},
            "metadata": self.metadata,
        }
        checksum = "sha256:" + hashlib.sha256(_canonical(body)).hexdigest()
        return json.dumps({**body, "checksum": checksum}, sort_keys=True).encode()

    @classmethod
    def from_artifact(cls, data: bytes) -> Policy:
        """Load an artefact, verifying its format and checksum; raises `PolicyError`."""
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("format") != ARTIFACT_FORMAT:
                raise PolicyError("not a tabloop policy artefact")
            checksum = doc.pop("checksum", None)
            expected = "sha256:" + hashlib.sha256(_canonical(doc)).hexdigest()
            if checksum != expected:
                raise PolicyError("policy checksum does not match its content")
            space = FeatureSpace.from_json(doc["features"])
            normaliser = Normaliser(
                tuple(float(v) for v in doc["normaliser"]["mean"]),
                tuple(float(v) for v in doc["normaliser"]["scale"]),
            )
            if len(normaliser.mean) != space.dim or len(normaliser.scale) != space.dim:
                raise PolicyError("normaliser does not match the feature space")
            if any(s <= 0 for s in normaliser.scale):
                raise PolicyError("normaliser has a non-positive scale")
            model = ShowModel(space.dim, int(doc["model"]["hidden"]))
            state = {
                k: torch.tensor(v, dtype=torch.float64) for k, v in doc["model"]["state"].items()
            }
            model.load_state_dict(state, strict=True)
            return cls(
                version=str(doc["version"]),
                space=space,
                normaliser=normaliser,
                model=model,
                show_floor=float(doc["show_floor"]),
                metadata=dict(doc.get("metadata") or {}),
            )
        except PolicyError:
            raise
        except (ValueError, KeyError, TypeError, RuntimeError, AttributeError) as exc:
            raise PolicyError(f"malformed policy artefact: {exc}") from exc


def builtin_policy(show_floor: float = DEFAULT_SHOW_FLOOR) -> Policy:
    """The policy before any learning: show when the model is confident.

    The logit is 4 * (mean token logprob + 0.8), so suggestions whose tokens average below ~45%
    probability are mostly silenced, and one that repeats the code after the cursor is silenced.
    Without logprobs (a runner that gives none, a cache hit) the mean counts as 0: show.
    """
    space = FeatureSpace()
    model = ShowModel(space.dim, hidden=0)
    names = space.names
    weights = torch.zeros(space.dim, dtype=torch.float64)
    weights[names.index("logprob_mean")] = 4.0
    weights[names.index("repeats_suffix")] = -6.0
    with torch.no_grad():
        model.linear.weight.copy_(weights.unsqueeze(0))
        model.linear.bias.fill_(3.2)
    return Policy(
        version=BUILTIN_VERSION,
        space=space,
        normaliser=Normaliser.identity(space.dim),
        model=model,
        show_floor=show_floor,
        metadata={"description": "show when the model is confident"},
    )
