"""A reward model q(x, show) for doubly robust estimates: ridge regression on shown decisions.

It has its own feature normalisation, independent of any policy, so the serving policy and a
candidate are evaluated against the same q.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from backend.policy.rewards import LoggedDecision
from completion.gate import Features, FeatureSpace, Normaliser


@dataclass(frozen=True)
class RewardModel:
    """Predicts the reward of showing a suggestion from its features."""

    space: FeatureSpace
    normaliser: Normaliser
    coef: np.ndarray  # one weight per input, then the intercept
    lo: float
    hi: float

    @classmethod
    def fit(
        cls,
        decisions: Sequence[LoggedDecision],
        *,
        space: FeatureSpace,
        ridge: float,
        lo: float,
        hi: float,
    ) -> RewardModel:
        """Ridge regression of reward on features over the shown decisions (intercept free)."""
        shown = [d for d in decisions if d.shown]
        raw = space.matrix([d.features for d in shown])
        normaliser = Normaliser.fit(raw) if len(shown) else Normaliser.identity(space.dim)
        if not shown:
            return cls(space, normaliser, np.zeros(space.dim + 1), lo, hi)
        x = normaliser.apply(raw)
        design = np.hstack([x, np.ones((len(x), 1))])
        penalty = ridge * np.eye(design.shape[1])
        penalty[-1, -1] = 0.0  # the intercept is the mean reward, not shrunk toward 0
        target = np.array([d.reward for d in shown])
        coef = np.linalg.solve(design.T @ design + penalty, design.T @ target)
        return cls(space, normaliser, coef, lo, hi)

    @classmethod
    def zero(cls, space: FeatureSpace) -> RewardModel:
        """q = 0 everywhere: doubly robust reduces to IPS."""
        return cls(space, Normaliser.identity(space.dim), np.zeros(space.dim + 1), 0.0, 0.0)

    def predict(self, rows: Sequence[Features]) -> np.ndarray:
        if not rows:
            return np.zeros(0)
        x = self.normaliser.apply(self.space.matrix(rows))
        return np.clip(x @ self.coef[:-1] + self.coef[-1], self.lo, self.hi)
