"""Off-policy estimates recover the true value of a policy on a synthetic bandit."""

from __future__ import annotations

import json

import numpy as np
import pytest

from backend.policy import ope
from backend.policy.reward_model import RewardModel
from backend.policy.rewards import LoggedDecision
from completion.gate import Policy, ShowWeights, builtin_policy
from tests.backend.policy.synthetic import LAMBDA, Logger, contexts, true_value


def _target() -> Policy:
    """A policy unlike the logging one: shows more, and cares about code after the cursor."""
    builtin = builtin_policy()
    names = builtin.space.names
    weight = builtin.weights.linear_weight[0].copy()
    weight[names.index("logprob_mean")] = 2.0
    weight[names.index("code_after_cursor")] = -1.5
    return builtin.derive("target", weights=ShowWeights.logistic(weight, 2.5))


@pytest.fixture(scope="module")
def world() -> tuple[list[dict[str, float | str]], list[LoggedDecision], np.ndarray, Policy]:
    features = contexts(5000, seed=1)
    logged = Logger(builtin_policy(), seed=2).log(features)
    target = _target()
    return features, logged, target.p_show_batch(features), target


def test_ips_snips_and_dr_recover_the_true_value(world) -> None:
    features, logged, p_show, target = world
    batch = ope.LoggedBatch.of(logged)
    truth = true_value(target, features)
    q = RewardModel.fit(logged, space=target.space, ridge=1.0, lo=-LAMBDA, hi=1.0)
    estimates = {
        "ips": ope.ips(p_show, batch),
        "snips": ope.snips(p_show, batch),
        "dr": ope.doubly_robust(p_show, batch, q.predict(features)),
    }
    for name, estimate in estimates.items():
        assert abs(estimate.value - truth) < 3.5 * estimate.stderr + 0.01, (name, estimate, truth)
    # The reward model takes most of the noise out: DR is tighter than IPS.
    assert estimates["dr"].stderr < estimates["ips"].stderr


def test_dr_stays_unbiased_with_a_wrong_reward_model(world) -> None:
    features, logged, p_show, target = world
    batch = ope.LoggedBatch.of(logged)
    truth = true_value(target, features)
    wrong = np.full(len(features), 0.8)  # far from every true expected reward
    estimate = ope.doubly_robust(p_show, batch, wrong)
    assert abs(estimate.value - truth) < 3.5 * estimate.stderr + 0.01


def test_on_policy_weights_are_one_and_ess_is_n(world) -> None:
    features, logged, _, _ = world
    batch = ope.LoggedBatch.of(logged)
    logging_p = builtin_policy().p_show_batch(features)
    weights = ope.importance_weights(logging_p, batch)
    np.testing.assert_allclose(weights, 1.0, rtol=1e-6)
    assert ope.effective_sample_size(weights) == pytest.approx(len(batch))
    estimate = ope.snips(logging_p, batch)
    assert estimate.value == pytest.approx(float(np.mean(batch.reward)))


def test_ess_falls_when_the_weights_concentrate() -> None:
    assert ope.effective_sample_size(np.array([1.0, 1.0, 1.0, 1.0])) == pytest.approx(4.0)
    assert ope.effective_sample_size(np.array([4.0, 0.0, 0.0, 0.0])) == pytest.approx(1.0)


def test_paired_comparison_sees_a_difference_the_separate_errors_hide(world) -> None:
    features, logged, p_show, _ = world
    batch = ope.LoggedBatch.of(logged)
    q = np.zeros(len(features))
    a = ope.doubly_robust(p_show, batch, q)
    b = ope.doubly_robust(np.clip(p_show * 0.98, 0, 1), batch, q)
    comparison = ope.compare(a, b)
    assert comparison.gain == pytest.approx(a.value - b.value)
    assert comparison.stderr < max(a.stderr, b.stderr)


@pytest.mark.parametrize(
    ("shown", "p_show"),
    [
        pytest.param([True, True, True], [0.0, 0.0, 0.0], id="no-weight"),
        pytest.param([True], [0.5], id="one-decision"),
    ],
)
def test_estimates_without_evidence_write_null_not_infinity(
    shown: list[bool], p_show: list[float]
) -> None:
    batch = ope.LoggedBatch(
        shown=np.array(shown),
        propensity=np.full(len(shown), 0.8),
        reward=np.full(len(shown), -LAMBDA),
    )
    for estimate in (ope.ips(np.array(p_show), batch), ope.snips(np.array(p_show), batch)):
        assert not estimate.informative
        json.dumps(estimate.as_json(), allow_nan=False)  # raises on an infinity
    assert ope.snips(np.array(p_show), batch).as_json()["stderr"] is None
