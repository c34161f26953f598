"""The serving policy: normalise the features, compute the logit in numpy, draw the action.

P(show) = floor + (1 - floor) * sigmoid(logit). The floor keeps a little exploration on suggestions
the policy would otherwise silence (silence is worth 0 for certain, so it needs none); the smooth
form keeps a gradient everywhere, which the trainer needs.

The logit is a logistic part plus an optional small tanh MLP. Serving only evaluates it, so it is
plain numpy here; the trainer's differentiable twin (`backend.policy.show_model.ShowModel`) uses
the same parameter names and shapes and is tested to give the same probabilities.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from completion.gate.features import Features, FeatureSpace, is_empty
from completion.types import Action

DEFAULT_SHOW_FLOOR = 0.05
BUILTIN_VERSION = "builtin"


class PolicyError(Exception):
    """A policy artefact that cannot be trusted: malformed, or its checksum does not match."""


@dataclass(frozen=True)
class Normaliser:
    """Standardisation of the input vector; missing values become the mean (0 after scaling)."""

    mean: tuple[float, ...]
    scale: tuple[float, ...]

    @classmethod
    def identity(cls, dim: int) -> Normaliser:
        """No change: mean 0, scale 1 (missing values become 0)."""
        return cls((0.0,) * dim, (1.0,) * dim)

    @classmethod
    def fit(cls, matrix: np.ndarray) -> Normaliser:
        """Mean and standard deviation per column (scale 1 for constant or all-missing columns)."""
        if not len(matrix):
            return cls.identity(matrix.shape[1])
        present = ~np.isnan(matrix)
        counts = present.sum(axis=0)
        values = np.where(present, matrix, 0.0)
        # Computed from counts rather than nanmean/nanstd: a column no event carries is normal
        # (an older client), not a numerical warning.
        mean = values.sum(axis=0) / np.maximum(counts, 1)
        spread = np.where(present, matrix - mean, 0.0)
        std = np.sqrt((spread**2).sum(axis=0) / np.maximum(counts, 1))
        std = np.where((counts == 0) | (std < 1e-6), 1.0, std)
        return cls(tuple(float(m) for m in mean), tuple(float(s) for s in std))

    def apply(self, matrix: np.ndarray) -> np.ndarray:
        """Normalised float64 rows of a raw input matrix."""
        mean = np.asarray(self.mean, dtype=np.float64)
        filled = np.where(np.isnan(matrix), mean, matrix)
        return np.asarray((filled - mean) / np.asarray(self.scale, dtype=np.float64))


def _frozen(values: Any, shape: tuple[int, ...], name: str) -> np.ndarray:
    """A read-only float64 copy of `values` with exactly `shape`; raises `PolicyError`."""
    array = np.array(values, dtype=np.float64)  # a copy: nobody else holds a reference
    if array.shape != shape:
        raise PolicyError(f"model parameter {name} has shape {array.shape}, expected {shape}")
    array.setflags(write=False)  # policies are shared between threads without a lock
    return array


def sigmoid(z: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-z) without overflow and with full precision on both tails (as torch's)."""
    e = np.exp(-np.abs(z))
    return np.asarray(np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e)))


@dataclass(frozen=True, eq=False)
class ShowWeights:
    """The parameters of the logit of showing, float64 and read-only.

    Named as the trainer's torch module names its state (`linear.weight`, `mlp_in.bias`, ...) and
    with its shapes, so the artefact's `model.state` is the same document on both sides.
    """

    linear_weight: np.ndarray  # (1, dim)
    linear_bias: np.ndarray  # (1,)
    mlp_in_weight: np.ndarray | None = None  # (hidden, dim)
    mlp_in_bias: np.ndarray | None = None  # (hidden,)
    mlp_out_weight: np.ndarray | None = None  # (1, hidden)
    mlp_out_bias: np.ndarray | None = None  # (1,)

    @property
    def dim(self) -> int:
        """Length of the input vector."""
        return int(self.linear_weight.shape[1])

    @property
    def hidden(self) -> int:
        """Units of the MLP part (0: logistic only)."""
        return 0 if self.mlp_in_weight is None else int(self.mlp_in_weight.shape[0])

    @classmethod
    def logistic(cls, weight: Sequence[float] | np.ndarray, bias: float) -> ShowWeights:
        """A logistic logit `weight . x + bias`."""
        vector = np.asarray(weight, dtype=np.float64)
        return cls.from_state(
            {"linear.weight": vector.reshape(1, -1), "linear.bias": [bias]},
            dim=len(vector),
            hidden=0,
        )

    @classmethod
    def from_state(cls, state: Mapping[str, Any], *, dim: int, hidden: int) -> ShowWeights:
        """Parameters from a state document (nested lists or arrays); raises `PolicyError`.

        Like torch's strict `load_state_dict`: every key the shape needs, no other, exact shapes.
        """
        if dim < 1 or hidden < 0:
            raise PolicyError(f"model of input size {dim} and {hidden} hidden units")
        shapes: dict[str, tuple[int, ...]] = {"linear.weight": (1, dim), "linear.bias": (1,)}
        if hidden:
            shapes |= {
                "mlp_in.weight": (hidden, dim),
                "mlp_in.bias": (hidden,),
                "mlp_out.weight": (1, hidden),
                "mlp_out.bias": (1,),
            }
        if set(state) != set(shapes):
            raise PolicyError(f"model state has {sorted(state)}, expected {sorted(shapes)}")
        arrays = {name: _frozen(state[name], shape, name) for name, shape in shapes.items()}
        return cls(
            arrays["linear.weight"],
            arrays["linear.bias"],
            arrays.get("mlp_in.weight"),
            arrays.get("mlp_in.bias"),
            arrays.get("mlp_out.weight"),
            arrays.get("mlp_out.bias"),
        )

    def state(self) -> dict[str, np.ndarray]:
        """The parameters by their torch state names."""
        state = {"linear.weight": self.linear_weight, "linear.bias": self.linear_bias}
        if self.mlp_in_weight is not None:
            assert self.mlp_in_bias is not None and self.mlp_out_weight is not None
            assert self.mlp_out_bias is not None
            state |= {
                "mlp_in.weight": self.mlp_in_weight,
                "mlp_in.bias": self.mlp_in_bias,
                "mlp_out.weight": self.mlp_out_weight,
                "mlp_out.bias": self.mlp_out_bias,
            }
        return state

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Logits of showing for normalised input rows `x` of shape (n, dim)."""
        logit = (x @ self.linear_weight.T + self.linear_bias)[:, 0]
        if self.mlp_in_weight is not None:
            assert self.mlp_in_bias is not None and self.mlp_out_weight is not None
            assert self.mlp_out_bias is not None
            hidden = np.tanh(x @ self.mlp_in_weight.T + self.mlp_in_bias)
            logit = logit + (hidden @ self.mlp_out_weight.T + self.mlp_out_bias)[:, 0]
        return np.asarray(logit)

    def renormalised(self, old: Normaliser, new: Normaliser) -> ShowWeights:
        """The same logit function of the raw input, for inputs normalised by `new` not `old`.

        Only the layers that read the input change: w' = w * s'/s and b' = b + w . (m' - m)/s.
        """
        old_m, old_s = np.asarray(old.mean), np.asarray(old.scale)
        new_m, new_s = np.asarray(new.mean), np.asarray(new.scale)
        shift = (new_m - old_m) / old_s
        ratio = new_s / old_s
        state: dict[str, np.ndarray] = dict(self.state())
        for layer in ("linear", "mlp_in") if self.hidden else ("linear",):
            w = state[f"{layer}.weight"]
            state[f"{layer}.bias"] = state[f"{layer}.bias"] + w @ shift
            state[f"{layer}.weight"] = w * ratio
        return ShowWeights.from_state(state, dim=self.dim, hidden=self.hidden)


@dataclass
class Policy:
    """A versioned show/silence policy; immutable once built, so threads may share it."""

    version: str
    space: FeatureSpace
    normaliser: Normaliser
    weights: ShowWeights
    show_floor: float = DEFAULT_SHOW_FLOOR
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0.0 <= self.show_floor <= 1.0:
            raise PolicyError(f"show floor {self.show_floor} outside [0, 1]")
        if self.weights.dim != self.space.dim or len(self.normaliser.mean) != self.space.dim:
            raise PolicyError("model or normaliser does not match the feature space")

    # -- evaluation ---------------------------------------------------------------------------

    def inputs(self, rows: Sequence[Features]) -> np.ndarray:
        """Normalised model inputs for logged or live feature dicts."""
        return self.normaliser.apply(self.space.matrix(rows))

    def p_show_batch(self, rows: Sequence[Features]) -> np.ndarray:
        """P(show) for many feature dicts; 0 where there is no suggestion."""
        if not rows:
            return np.zeros(0)
        intent = sigmoid(self.weights.logits(self.inputs(rows)))
        p = self.show_floor + (1.0 - self.show_floor) * intent
        return np.where(_empty(rows), 0.0, p)

    def intent_batch(self, rows: Sequence[Features]) -> np.ndarray:
        """P(show) without the exploration floor: what the policy would do if it did not explore."""
        if not rows:
            return np.zeros(0)
        p = sigmoid(self.weights.logits(self.inputs(rows)))
        return np.where(_empty(rows), 0.0, p)

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
        weights: ShowWeights | None = None,
    ) -> Policy:
        """A copy under a new version, optionally re-expressed over another normaliser.

        Re-normalising changes the input layers so the logit function stays exactly the same,
        which lets a candidate start from the serving policy while using statistics of newer
        data. New `weights` are taken as given, for the normaliser the copy ends up with.
        """
        target = normaliser or self.normaliser
        if weights is None:
            weights = self.weights
            if target != self.normaliser:
                weights = weights.renormalised(self.normaliser, target)
        return dataclasses.replace(
            self,
            version=version,
            normaliser=target,
            weights=weights,
            show_floor=self.show_floor if show_floor is None else show_floor,
            metadata=dict(self.metadata if metadata is None else metadata),
        )

    def with_floor(self, show_floor: float) -> Policy:
        """The same policy with another exploration floor (the editor's setting)."""
        if show_floor == self.show_floor:
            return self
        return self.derive(self.version, show_floor=show_floor)


@dataclass
class CanaryPolicy(Policy):
    """A new version serving a share of decisions, the previous version the rest.

    Each decision is the candidate's with probability `share`, else the previous version's, so
    the action is drawn with the mixture's probability: P(show) = share * p_candidate +
    (1 - share) * p_previous, and that is the propensity logged. Off-policy training on these
    decisions stays unbiased. Its own fields (weights, normaliser) are the candidate's; its
    version is the candidate's.
    """

    previous: Policy | None = None
    share: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.previous is None:
            raise PolicyError("a canary needs the version it runs beside")
        if not 0.0 <= self.share <= 1.0:
            raise PolicyError(f"canary share {self.share} outside [0, 1]")

    @property
    def candidate(self) -> Policy:
        """The new version alone."""
        return Policy(
            self.version,
            self.space,
            self.normaliser,
            self.weights,
            self.show_floor,
            dict(self.metadata),
        )

    def _mix(self, candidate: np.ndarray, previous: np.ndarray) -> np.ndarray:
        return np.asarray(self.share * candidate + (1.0 - self.share) * previous)

    def p_show_batch(self, rows: Sequence[Features]) -> np.ndarray:
        assert self.previous is not None
        return self._mix(self.candidate.p_show_batch(rows), self.previous.p_show_batch(rows))

    def intent_batch(self, rows: Sequence[Features]) -> np.ndarray:
        assert self.previous is not None
        return self._mix(self.candidate.intent_batch(rows), self.previous.intent_batch(rows))

    def with_floor(self, show_floor: float) -> Policy:
        assert self.previous is not None
        if show_floor == self.show_floor and show_floor == self.previous.show_floor:
            return self
        return dataclasses.replace(
            self, show_floor=show_floor, previous=self.previous.with_floor(show_floor)
        )


def _empty(rows: Sequence[Features]) -> np.ndarray:
    return np.fromiter((is_empty(f) for f in rows), dtype=bool, count=len(rows))


# The built-in policy's weights (see `builtin_policy`).
BUILTIN_HEAD_WEIGHT = 2.5
BUILTIN_HEAD_FLOOR = -1.5
BUILTIN_MEAN_WEIGHT = 2.0
BUILTIN_MEAN_FLOOR = -0.8


def builtin_policy(show_floor: float = DEFAULT_SHOW_FLOOR) -> Policy:
    """The policy before any learning: show when the model is sure of how the suggestion starts.

    `tabloop bench gate` measured the confidence of the first tokens (`logprob_head_min`, the
    least log-probability of the first three; AUC 0.74-0.77 for acceptance) as a better judge
    than the mean over all tokens (0.69-0.71), which is kept with a smaller weight. The logit is
    2.5 * (head_min + 1.5) + 2 * (mean + 0.8): a suggestion whose first tokens are each likelier
    than about 22% and whose tokens average above about 45% is shown; one that repeats the code
    after the cursor is silenced. Without logprobs (a runner that gives none, a cache hit) both
    count as 0: show.
    """
    space = FeatureSpace()
    names = space.names
    weight = np.zeros(space.dim)
    weight[names.index("logprob_head_min")] = BUILTIN_HEAD_WEIGHT
    weight[names.index("logprob_mean")] = BUILTIN_MEAN_WEIGHT
    weight[names.index("repeats_suffix")] = -6.0
    bias = -BUILTIN_HEAD_WEIGHT * BUILTIN_HEAD_FLOOR - BUILTIN_MEAN_WEIGHT * BUILTIN_MEAN_FLOOR
    return Policy(
        version=BUILTIN_VERSION,
        space=space,
        normaliser=Normaliser.identity(space.dim),
        weights=ShowWeights.logistic(weight, bias),
        show_floor=show_floor,
        metadata={"description": "show when the model is sure of how the suggestion starts"},
    )
