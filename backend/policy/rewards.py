"""From events to rewards: join each decision with its outcome and retention.

Reward of one decision, in characters of code (λ = `distraction_cost`, in characters too):

- silence: 0;
- accepted: the characters accepted x their retained share at the retention checkpoint (the
  characters still there);
- partial: the same for the characters taken (a partial acceptance counts by its share);
- ignored or dismissed: -λ, the cost of a distraction;
- superseded (the user typed on before the suggestion could be judged) and not viewed: not a
  choice the user made, so the decision is left out of training.

Counting characters rather than suggestions makes a long suggestion that is kept worth more than
a short one: a policy that keeps only short sure things loses reward, not just accepted code.

A decision still waiting for its outcome or retention is left out until the wait configured in
`RewardSettings` has passed; then a missing outcome counts as ignored and a missing retention as
fully retained.

Events carry UTC offsets (the schema refuses naive times, and `backend/policy/dataset.py` skips
stored events the schema refuses); a naive `now`, or an event built without validation, is read
as UTC so that comparing it with an aware time cannot fail.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from backend.policy.settings import RewardSettings
from telemetry.events import DecisionEvent, OutcomeEvent, RetentionEvent

Reward = float


def as_utc(time: datetime) -> datetime:
    """`time` with an offset: a naive time is taken to be UTC."""
    return time.replace(tzinfo=UTC) if time.tzinfo is None else time


@dataclass(frozen=True)
class LoggedDecision:
    """One decision with what the trainer needs: features, action, propensity, reward."""

    decision_id: str
    time: datetime
    policy_version: str
    action: str  # "show" | "silence"
    propensity: float  # probability the logging policy gave to `action`
    reward: Reward
    features: Mapping[str, float | str] = field(default_factory=dict)
    accepted_chars: int = 0
    retained_chars: int = 0
    model_version: str | None = None  # the adapter version that made it (None: not known)

    @property
    def shown(self) -> bool:
        return self.action == "show"


def outcome_reward(
    kind: str,
    suggestion_chars: int,
    accepted_chars: int | None,
    retained_share: float,
    settings: RewardSettings,
) -> Reward | None:
    """The reward of a shown suggestion's outcome; None when it should not be learned from.

    Accepted: the suggestion's characters (the accepted count when it is given), partial: the
    accepted characters (at most the suggestion's), each times the retained share.
    """
    if kind == "accepted":
        chars = accepted_chars if accepted_chars else suggestion_chars
        return float(chars) * retained_share
    if kind == "partial":
        taken = accepted_chars or 0
        chars = min(taken, suggestion_chars) if suggestion_chars else taken
        return float(chars) * retained_share
    if kind in ("ignored", "dismissed"):
        return -settings.distraction_cost
    return None


def join_rewards(
    decisions: Iterable[DecisionEvent],
    outcomes: Iterable[OutcomeEvent],
    retentions: Iterable[RetentionEvent],
    *,
    now: datetime,
    settings: RewardSettings,
) -> list[LoggedDecision]:
    """Rewarded decisions, oldest first; decisions still waiting for evidence are left out."""
    now = as_utc(now)
    outcome_by_id: dict[str, OutcomeEvent] = {}
    for outcome in outcomes:
        # Several outcomes for one decision (a retry, a later partial): the first one counts,
        # since it is what the user did when the suggestion was in front of them.
        held = outcome_by_id.get(outcome.decision_id)
        if held is None or as_utc(outcome.time) < as_utc(held.time):
            outcome_by_id[outcome.decision_id] = outcome
    retention_by_id: dict[str, RetentionEvent] = {}
    for retention in retentions:
        if retention.after_s == settings.retention_after_s:
            retention_by_id[retention.decision_id] = retention

    logged: list[LoggedDecision] = []
    for decision in decisions:
        age_s = (now - as_utc(decision.time)).total_seconds()
        features = dict(decision.features)
        chars = int(decision.suggestion_chars or features.get("suggestion_chars", 0) or 0)
        if decision.action == "silence":
            logged.append(_logged(decision, 0.0))
            continue
        found = outcome_by_id.get(decision.decision_id)
        if found is None:
            if age_s < settings.outcome_wait_s:
                continue
            logged.append(_logged(decision, -settings.distraction_cost))
            continue
        outcome = found
        accepted = 0
        retained = 0
        share = 1.0
        if outcome.kind in ("accepted", "partial"):
            accepted = outcome.accepted_chars or 0
            checkpoint = retention_by_id.get(decision.decision_id)
            if checkpoint is not None:
                share = (
                    checkpoint.retained_chars / checkpoint.accepted_chars
                    if checkpoint.accepted_chars
                    else 0.0
                )
                retained = checkpoint.retained_chars
            elif (now - as_utc(outcome.time)).total_seconds() < settings.retention_wait_s:
                continue
            else:
                retained = accepted
        reward = outcome_reward(outcome.kind, chars, accepted, share, settings)
        if reward is None:
            continue
        logged.append(_logged(decision, reward, accepted, retained))
    logged.sort(key=lambda d: d.time)
    return logged


def _logged(
    decision: DecisionEvent, reward: Reward, accepted: int = 0, retained: int = 0
) -> LoggedDecision:
    return LoggedDecision(
        decision_id=decision.decision_id,
        time=as_utc(decision.time),
        policy_version=decision.policy_version,
        action=decision.action,
        propensity=decision.propensity,
        reward=reward,
        features=dict(decision.features),
        accepted_chars=accepted,
        retained_chars=retained,
        model_version=decision.model_version,
    )
