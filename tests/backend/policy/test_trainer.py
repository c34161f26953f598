"""Training improves reward where the best policy is known; promotion refuses bad candidates."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from backend.policy.rewards import LoggedDecision
from backend.policy.settings import TrainerSettings
from backend.policy.trainer import (
    evaluate,
    fit_candidate,
    judge,
    reward_model_for,
    split_holdout,
    train_and_judge,
)
from completion.gate import Policy, ShowWeights, builtin_policy, from_artifact, to_artifact
from tests.backend.policy.synthetic import (
    Logger,
    contexts,
    expected_show_reward,
    optimal_value,
    true_value,
)

SETTINGS = TrainerSettings(min_events=100)


@pytest.fixture(scope="module")
def logged() -> list[LoggedDecision]:
    return Logger(builtin_policy(), seed=4).log(contexts(4000, seed=3))


@pytest.fixture(scope="module")
def fresh() -> list[dict[str, float | str]]:
    return contexts(3000, seed=99)


@pytest.fixture(scope="module")
def run(logged: list[LoggedDecision]):
    result = train_and_judge(builtin_policy(), logged, SETTINGS, "v1")
    assert result is not None
    return result


@pytest.mark.parametrize("estimator", ["dr", "ips"])
def test_training_improves_true_reward_toward_the_optimum(
    logged: list[LoggedDecision], fresh: list[dict[str, float | str]], estimator: str
) -> None:
    settings = SETTINGS.model_copy(update={"estimator": estimator})
    serving = builtin_policy()
    train, _ = split_holdout(logged, settings.holdout_fraction)
    q = reward_model_for(train, serving, settings)
    candidate = fit_candidate(serving, train, q, settings, "v1")
    before, after = true_value(serving, fresh), true_value(candidate, fresh)
    best = optimal_value(fresh, floor=settings.show_floor)  # the best policy that still explores
    assert after > before
    # Most of the gap to that optimum is closed.
    assert (after - before) / (best - before) > 0.6, (before, after, best)
    # And it agrees with the optimal action where the choice matters.
    rewards = np.array([expected_show_reward(f) for f in fresh])
    decisive = np.abs(rewards) > 0.1
    intent = candidate.intent_batch(fresh) > 0.5
    agreement = np.mean(intent[decisive] == (rewards[decisive] > 0))
    assert agreement > 0.9


def test_a_better_candidate_is_promoted(run) -> None:
    assert run.verdict.promote, run.report
    assert run.report["candidate"]["dr"]["value"] > run.report["serving"]["dr"]["value"]
    assert run.candidate.metadata["parent"] == "builtin"
    # The evaluation travels with the version.
    assert from_artifact(to_artifact(run.candidate)).metadata["evaluation"]["promote"]


def test_a_worse_candidate_is_refused(
    run, logged: list[LoggedDecision], fresh: list[dict[str, float | str]]
) -> None:
    # Against the trained policy as the serving one, the builtin is the worse candidate.
    train, holdout = split_holdout(logged, SETTINGS.holdout_fraction)
    q = reward_model_for(train, builtin_policy(), SETTINGS)
    assert true_value(builtin_policy(), fresh) < true_value(run.candidate, fresh)
    verdict = judge(
        evaluate(builtin_policy(), holdout, q), evaluate(run.candidate, holdout, q), SETTINGS
    )
    assert not verdict.promote
    assert any("gain" in reason for reason in verdict.reasons)


def _silence_everything() -> Policy:
    policy = builtin_policy()
    return policy.derive("mute", weights=ShowWeights.logistic(np.zeros(policy.space.dim), -30.0))


def test_a_candidate_that_silences_everything_is_refused_even_when_it_scores_higher() -> None:
    # A world where nearly every suggestion is rejected: silence really is worth more here,
    # yet a policy that never speaks would stop the loop from learning anything.
    logged = Logger(builtin_policy(), seed=4).log(contexts(2000, seed=3))
    hostile = [
        LoggedDecision(
            d.decision_id,
            d.time,
            d.policy_version,
            d.action,
            d.propensity,
            -0.25 if d.shown else 0.0,
            d.features,
        )
        for d in logged
    ]
    train, holdout = split_holdout(hostile, SETTINGS.holdout_fraction)
    q = reward_model_for(train, builtin_policy(), SETTINGS)
    mute = evaluate(_silence_everything(), holdout, q)
    serving = evaluate(builtin_policy(), holdout, q)
    assert mute.dr.value > serving.dr.value
    verdict = judge(mute, serving, SETTINGS)
    assert not verdict.promote
    assert any("shown rate" in reason for reason in verdict.reasons)


def test_too_few_events_train_nothing(logged: list[LoggedDecision]) -> None:
    assert train_and_judge(builtin_policy(), logged[:50], SETTINGS, "v1") is None


def test_holdout_is_the_newest_events() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    decisions = [
        LoggedDecision(f"d{i}", start + timedelta(seconds=-i), "v", "silence", 1.0, 0.0)
        for i in range(10)
    ]
    train, holdout = split_holdout(decisions, 0.3)
    assert len(holdout) == 3
    assert min(d.time for d in holdout) > max(d.time for d in train)
