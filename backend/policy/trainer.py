"""Training and judging a candidate policy from logged decisions.

The candidate starts from the serving policy (re-expressed over the new data's normalisation, so
it starts as exactly the same function) and climbs the doubly robust estimate of its reward,

    J(theta) = 1/n sum_i [ p_i q_i + 1[a_i = show] min(p_i / mu_i, C) (r_i - q_i) ]
               - proximal/2 |theta - theta_serving|^2 - l2/2 |theta|^2,

with p_i = pi_theta(show | x_i), q_i the reward model's prediction for showing and C the weight
clip. The clip stops single rare decisions (small mu) from dominating a step; where it binds the
gradient through that weight is zero, which keeps the candidate near the evidence. With q = 0 the
objective is the clipped IPS one.

The newest events are held out; the candidate is promoted only when the paired doubly robust gain
over the serving policy on them clears the margin and its confidence bound, with enough effective
sample size, and without its shown rate collapsing. A holdout that carries no evidence about
either policy (say every held-out suggestion was empty, so neither policy could show one) gives
the verdict "not enough signal" and a report whose unknown numbers are null, never infinite.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from backend.policy import ope
from backend.policy.reward_model import RewardModel
from backend.policy.rewards import LoggedDecision
from backend.policy.settings import TrainerSettings
from backend.policy.show_model import ShowModel, show_probability
from completion.gate import Normaliser, Policy, is_empty


@dataclass(frozen=True)
class PolicyEvaluation:
    """Off-policy estimates of one policy on held-out decisions."""

    dr: ope.Estimate
    snips: ope.Estimate
    ips: ope.Estimate
    shown_rate: float  # share of non-empty suggestions it would show, without exploration
    show_probability: float  # the same with exploration: what it would actually show

    def as_json(self) -> dict[str, Any]:
        return {
            "dr": self.dr.as_json(),
            "snips": self.snips.as_json(),
            "ips": self.ips.as_json(),
            "shown_rate": self.shown_rate,
            "show_probability": self.show_probability,
        }


@dataclass(frozen=True)
class Verdict:
    """Whether a candidate should replace the serving policy, and why."""

    promote: bool
    reasons: list[str]
    gain: float
    gain_stderr: float
    enough_signal: bool = True  # False: the holdout says nothing about either policy


@dataclass
class TrainingRun:
    """One candidate, its evaluation against the serving policy and the verdict."""

    candidate: Policy
    verdict: Verdict
    report: dict[str, Any] = field(default_factory=dict)


def split_holdout(
    decisions: Sequence[LoggedDecision], fraction: float
) -> tuple[list[LoggedDecision], list[LoggedDecision]]:
    """Oldest (1 - fraction) for training, newest `fraction` held out."""
    ordered = sorted(decisions, key=lambda d: d.time)
    cut = round(len(ordered) * (1.0 - fraction))
    return ordered[:cut], ordered[cut:]


def _with_hidden(policy: Policy, hidden: int, seed: int) -> Policy:
    """The policy with an MLP part of `hidden` units (new units start with zero output)."""
    if policy.weights.hidden == hidden or hidden == 0:
        return policy
    torch.manual_seed(seed)
    model = ShowModel(policy.weights.dim, hidden)
    with torch.no_grad():
        model.linear.weight.copy_(torch.tensor(policy.weights.linear_weight))
        model.linear.bias.copy_(torch.tensor(policy.weights.linear_bias))
    return policy.derive(policy.version, metadata=policy.metadata, weights=model.to_weights())


def reward_model_for(
    train: Sequence[LoggedDecision], policy: Policy, settings: TrainerSettings
) -> RewardModel:
    """The q used by the objective and by evaluation (zero for the IPS estimator)."""
    if settings.estimator == "ips":
        return RewardModel.zero(policy.space)
    return RewardModel.fit(
        train,
        space=policy.space,
        ridge=settings.reward_model_ridge,
        lo=-settings.rewards.distraction_cost,
        # Rewards are characters: the most any logged suggestion earned bounds the prediction.
        hi=max([1.0, *(d.reward for d in train if d.shown)]),
    )


def fit_candidate(
    serving: Policy,
    train: Sequence[LoggedDecision],
    q: RewardModel,
    settings: TrainerSettings,
    version: str,
) -> Policy:
    """Train a candidate from the serving policy on logged decisions."""
    active = [d for d in train if not is_empty(d.features)]
    raw = serving.space.matrix([d.features for d in active])
    normaliser = Normaliser.fit(raw) if active else serving.normaliser
    candidate = serving.derive(
        version,
        normaliser=normaliser,
        show_floor=settings.show_floor,
        metadata={"parent": serving.version},
    )
    candidate = _with_hidden(candidate, settings.hidden, settings.seed)
    if not active:
        return candidate
    x = torch.as_tensor(candidate.inputs([d.features for d in active]), dtype=torch.float64)
    shown = torch.tensor([d.shown for d in active], dtype=torch.float64)
    mu = torch.tensor([d.propensity for d in active], dtype=torch.float64).clamp_min(1e-6)
    reward = torch.tensor([d.reward for d in active], dtype=torch.float64)
    q_show = torch.tensor(q.predict([d.features for d in active]), dtype=torch.float64)
    n_all = float(len(train))  # empty suggestions count as requests worth 0 under any policy

    model = ShowModel.from_weights(candidate.weights)
    model.train()
    anchor = [p.detach().clone() for p in model.parameters()]
    optimiser = torch.optim.Adam(model.parameters(), lr=settings.learning_rate)
    for _ in range(settings.steps):
        optimiser.zero_grad()
        p = show_probability(model, x, candidate.show_floor)
        weight = torch.clamp(p / mu, max=settings.weight_clip)
        value = torch.sum(p * q_show + shown * weight * (reward - q_show)) / n_all
        penalty = sum(
            settings.proximal / 2 * torch.sum((w - a) ** 2) + settings.l2 / 2 * torch.sum(w**2)
            for w, a in zip(model.parameters(), anchor, strict=True)
        )
        loss = -value + penalty
        loss.backward()
        optimiser.step()
    model.eval()
    return candidate.derive(version, metadata=candidate.metadata, weights=model.to_weights())


def evaluate(policy: Policy, holdout: Sequence[LoggedDecision], q: RewardModel) -> PolicyEvaluation:
    """Off-policy estimates of `policy` on held-out decisions."""
    rows = [d.features for d in holdout]
    batch = ope.LoggedBatch.of(list(holdout))
    p_show = policy.p_show_batch(rows)
    q_show = q.predict(rows)
    non_empty = np.array([not is_empty(f) for f in rows], dtype=bool)
    intent = policy.intent_batch(rows)
    return PolicyEvaluation(
        dr=ope.doubly_robust(p_show, batch, q_show),
        snips=ope.snips(p_show, batch),
        ips=ope.ips(p_show, batch),
        shown_rate=float(np.mean(intent[non_empty])) if non_empty.any() else 0.0,
        show_probability=float(np.mean(p_show[non_empty])) if non_empty.any() else 0.0,
    )


NOT_ENOUGH_SIGNAL = "not enough signal"


def comparison_finite(comparison: ope.Comparison) -> bool:
    """Whether a paired comparison has a finite gain and standard error."""
    return math.isfinite(comparison.gain) and math.isfinite(comparison.stderr)


def judge(
    candidate: PolicyEvaluation, serving: PolicyEvaluation, settings: TrainerSettings
) -> Verdict:
    """The promotion rules (see docs/learning.md)."""
    comparison = ope.compare(candidate.dr, serving.dr)
    if not (candidate.dr.informative and serving.dr.informative and comparison_finite(comparison)):
        # The other rules would compare numbers that mean nothing here; say what is missing.
        ess = min(candidate.dr.ess, serving.dr.ess)
        reason = (
            f"{NOT_ENOUGH_SIGNAL}: {len(candidate.dr.terms)} held-out decisions, "
            f"effective sample size {ess:.1f}"
        )
        return Verdict(False, [reason], comparison.gain, comparison.stderr, enough_signal=False)
    reasons: list[str] = []
    if comparison.gain < settings.margin:
        reasons.append(f"gain {comparison.gain:+.4f} below the margin {settings.margin}")
    bound = comparison.lower_bound(settings.confidence_z)
    if bound <= 0:
        reasons.append(f"gain not significant (lower bound {bound:+.4f})")
    if candidate.dr.ess < settings.min_ess:
        reasons.append(f"effective sample size {candidate.dr.ess:.1f} below {settings.min_ess}")
    collapse = max(settings.min_shown_rate, settings.shown_collapse_ratio * serving.shown_rate)
    if candidate.shown_rate < collapse:
        reasons.append(f"shown rate {candidate.shown_rate:.3f} collapses below {collapse:.3f}")
    return Verdict(
        not reasons, reasons or ["beats the serving policy"], comparison.gain, comparison.stderr
    )


def train_and_judge(
    serving: Policy,
    decisions: Sequence[LoggedDecision],
    settings: TrainerSettings,
    version: str,
) -> TrainingRun | None:
    """Train a candidate on older decisions and judge it on the newest; None if too few."""
    if len(decisions) < settings.min_events:
        return None
    train, holdout = split_holdout(decisions, settings.holdout_fraction)
    q = reward_model_for(train, serving, settings)
    candidate = fit_candidate(serving, train, q, settings, version)
    candidate_eval = evaluate(candidate, holdout, q)
    serving_eval = evaluate(serving, holdout, q)
    verdict = judge(candidate_eval, serving_eval, settings)
    report = {
        "train_events": len(train),
        "holdout_events": len(holdout),
        "candidate": candidate_eval.as_json(),
        "serving": {"version": serving.version, **serving_eval.as_json()},
        "gain": ope.json_number(verdict.gain),
        "gain_stderr": ope.json_number(verdict.gain_stderr),
        "enough_signal": verdict.enough_signal,
        "promote": verdict.promote,
        "reasons": verdict.reasons,
    }
    candidate.metadata.update({"evaluation": report})
    return TrainingRun(candidate, verdict, report)
