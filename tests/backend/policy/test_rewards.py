"""Decisions joined with outcomes and retention become the documented rewards (characters)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from backend.policy.rewards import join_rewards
from backend.policy.settings import RewardSettings
from telemetry.events import DecisionEvent, OutcomeEvent, RetentionEvent

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SETTINGS = RewardSettings(distraction_cost=3.0)


def _decision(action: str = "show", age_s: float = 1000.0, chars: int = 20) -> DecisionEvent:
    return DecisionEvent(
        decision_id="d1",
        session_id="s",
        install_id="i",
        language="python",
        trigger="automatic",
        policy_version="v1",
        model_id="m",
        action=action,  # type: ignore[arg-type]
        propensity=0.8,
        features={"suggestion_chars": float(chars)},
        suggestion_chars=chars,
        time=NOW - timedelta(seconds=age_s),
    )


def _outcome(kind: str, accepted: int | None = None, age_s: float = 900.0) -> OutcomeEvent:
    return OutcomeEvent(
        decision_id="d1",
        kind=kind,  # type: ignore[arg-type]
        accepted_chars=accepted,
        time=NOW - timedelta(seconds=age_s),
    )


def _retention(accepted: int, retained: int, after_s: int = 120) -> RetentionEvent:
    return RetentionEvent(
        decision_id="d1",
        after_s=after_s,  # type: ignore[arg-type]
        accepted_chars=accepted,
        retained_chars=retained,
        time=NOW,
    )


@pytest.mark.parametrize(
    ("decision", "outcomes", "retentions", "reward"),
    [
        pytest.param(_decision("silence"), [], [], 0.0, id="silence"),
        pytest.param(
            _decision(), [_outcome("accepted", 20)], [_retention(20, 20)], 20.0, id="kept"
        ),
        pytest.param(
            _decision(), [_outcome("accepted", 20)], [_retention(20, 15)], 15.0, id="half-kept"
        ),
        pytest.param(
            _decision(),
            [_outcome("accepted", 20)],
            [_retention(20, 5, after_s=30), _retention(20, 10)],
            10.0,
            id="the-120s-checkpoint-counts",
        ),
        pytest.param(_decision(), [_outcome("partial", 5)], [_retention(5, 5)], 5.0, id="partial"),
        pytest.param(
            _decision(), [_outcome("partial", 8)], [_retention(8, 6)], 6.0, id="partial-half-kept"
        ),
        pytest.param(
            _decision(chars=4),
            [_outcome("partial", 9)],
            [_retention(9, 9)],
            4.0,
            id="partial-at-most-the-suggestion",
        ),
        pytest.param(_decision(), [_outcome("ignored")], [], -3.0, id="ignored"),
        pytest.param(_decision(), [_outcome("dismissed")], [], -3.0, id="dismissed"),
        pytest.param(_decision(), [_outcome("superseded")], [], None, id="superseded"),
        pytest.param(_decision(), [_outcome("not_viewed")], [], None, id="not-viewed"),
        pytest.param(_decision(age_s=10), [], [], None, id="outcome-pending"),
        pytest.param(_decision(age_s=5000), [], [], -3.0, id="outcome-never-came"),
        pytest.param(
            _decision(), [_outcome("accepted", 20, age_s=60)], [], None, id="retention-pending"
        ),
        pytest.param(_decision(), [_outcome("accepted", 20)], [], 20.0, id="retention-never-came"),
        pytest.param(
            _decision(),
            [_outcome("ignored", age_s=100), _outcome("accepted", 20, age_s=800)],
            [_retention(20, 20)],
            20.0,
            id="first-outcome-counts",
        ),
    ],
)
def test_rewards(decision, outcomes, retentions, reward) -> None:
    logged = join_rewards([decision], outcomes, retentions, now=NOW, settings=SETTINGS)
    if reward is None:
        assert logged == []
        return
    (only,) = logged
    assert only.reward == pytest.approx(reward)
    assert only.propensity == 0.8 and only.action == decision.action


def test_lambda_is_configuration() -> None:
    logged = join_rewards(
        [_decision()],
        [_outcome("ignored")],
        [],
        now=NOW,
        settings=RewardSettings(distraction_cost=0.5),
    )
    assert logged[0].reward == -0.5
