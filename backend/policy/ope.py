"""Off-policy evaluation of a show/silence policy from logged decisions.

Notation: for logged decision i the logging policy chose action a_i with propensity mu_i and the
user's response gave reward r_i; the target policy shows with probability p_i = pi(show | x_i).
Silence is worth exactly 0, so its reward needs no estimating: only shown decisions carry
information about r(x, show).

- IPS:   V = 1/n sum_i w_i r_i, with w_i = pi(a_i | x_i) / mu_i.
- SNIPS: V = sum_i w_i r_i / sum_i w_i (self-normalised: bounded, less variance, small bias).
- DR:    V = 1/n sum_i [ p_i q(x_i) + 1[a_i = show] (p_i / mu_i) (r_i - q(x_i)) ], where q is a
  reward model for showing; unbiased if either q or the propensities are right, and the silence
  branch contributes nothing because its reward is known.

Each estimator also returns its per-decision terms, so two policies evaluated on the same events
can be compared pairwise (`compare`), which cancels most of the noise they share.

An estimate without evidence (one decision, or no decision the target policy could have made)
has an infinite standard error; `as_json` writes it as null, since JSON has no infinity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from backend.policy.rewards import LoggedDecision


@dataclass(frozen=True)
class LoggedBatch:
    """Logged decisions as arrays."""

    shown: np.ndarray  # bool
    propensity: np.ndarray  # probability of the logged action under the logging policy
    reward: np.ndarray

    @classmethod
    def of(cls, decisions: list[LoggedDecision]) -> LoggedBatch:
        return cls(
            shown=np.array([d.shown for d in decisions], dtype=bool),
            propensity=np.array([d.propensity for d in decisions], dtype=np.float64),
            reward=np.array([d.reward for d in decisions], dtype=np.float64),
        )

    def __len__(self) -> int:
        return len(self.reward)


def json_number(value: float) -> float | None:
    """`value` for a JSON document: None (null) when it is not finite."""
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class Estimate:
    """An estimated value per decision, its standard error and the evidence behind it."""

    value: float
    stderr: float
    ess: float
    terms: np.ndarray

    @property
    def informative(self) -> bool:
        """Whether the estimate rests on any evidence: finite, with a positive sample size."""
        return math.isfinite(self.value) and math.isfinite(self.stderr) and self.ess > 0

    def as_json(self) -> dict[str, float | None]:
        return {
            "value": json_number(self.value),
            "stderr": json_number(self.stderr),
            "ess": json_number(self.ess),
        }


def importance_weights(p_show: np.ndarray, batch: LoggedBatch) -> np.ndarray:
    """pi(a_i | x_i) / mu_i for every logged decision."""
    target = np.where(batch.shown, p_show, 1.0 - p_show)
    return target / np.maximum(batch.propensity, 1e-12)


def effective_sample_size(weights: np.ndarray) -> float:
    """Kish's effective sample size, (sum w)^2 / sum w^2."""
    total_sq = float(np.sum(weights**2))
    return float(np.sum(weights)) ** 2 / total_sq if total_sq > 0 else 0.0


def _stderr(terms: np.ndarray) -> float:
    return float(np.std(terms, ddof=1) / math.sqrt(len(terms))) if len(terms) > 1 else math.inf


def ips(p_show: np.ndarray, batch: LoggedBatch) -> Estimate:
    """Inverse propensity scoring."""
    weights = importance_weights(p_show, batch)
    terms = weights * batch.reward
    return Estimate(float(np.mean(terms)), _stderr(terms), effective_sample_size(weights), terms)


def snips(p_show: np.ndarray, batch: LoggedBatch) -> Estimate:
    """Self-normalised inverse propensity scoring.

    The standard error is the delta-method one; the terms are w_i (r_i - V) / mean(w), which
    average to zero and make pairwise comparison meaningful.
    """
    weights = importance_weights(p_show, batch)
    total = float(np.sum(weights))
    if total <= 0:
        zeros = np.zeros(len(batch))
        return Estimate(0.0, math.inf, 0.0, zeros)
    value = float(np.sum(weights * batch.reward) / total)
    terms = value + weights * (batch.reward - value) / float(np.mean(weights))
    return Estimate(value, _stderr(terms), effective_sample_size(weights), terms)


def doubly_robust(p_show: np.ndarray, batch: LoggedBatch, q_show: np.ndarray) -> Estimate:
    """Doubly robust estimate with reward model predictions `q_show` = q(x_i, show)."""
    weights = importance_weights(p_show, batch)
    correction = np.where(batch.shown, weights * (batch.reward - q_show), 0.0)
    terms = p_show * q_show + correction
    return Estimate(float(np.mean(terms)), _stderr(terms), effective_sample_size(weights), terms)


@dataclass(frozen=True)
class Comparison:
    """A candidate against a baseline on the same events."""

    gain: float
    stderr: float

    def lower_bound(self, z: float) -> float:
        return self.gain - z * self.stderr


def compare(candidate: Estimate, baseline: Estimate) -> Comparison:
    """Paired difference of two estimates made on the same logged decisions."""
    diff = candidate.terms - baseline.terms
    return Comparison(float(np.mean(diff)), _stderr(diff))
