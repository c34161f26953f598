"""A synthetic show/silence bandit whose best policy is known, for testing the learning math.

Each context is a real feature dict (made by `extract_features` from a synthetic request and
generation); the chance that a shown suggestion is accepted depends on the model's mean token
logprob and on whether code follows the cursor. The expected reward of showing is
P(accept) (1 + λ) - λ, so the optimal policy shows exactly when P(accept) > λ / (1 + λ).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

from backend.policy.rewards import LoggedDecision
from completion.gate import Policy, Signals, extract_features
from completion.types import CompletionRequest, Generation

LAMBDA = 0.25
LANGUAGES = ("python", "go", "rust", "haskell")


def p_accept(features: dict[str, float | str]) -> float:
    """The synthetic user's chance of accepting a shown suggestion."""
    lm = float(features["logprob_mean"])
    code_after = float(features["code_after_cursor"])
    return 1.0 / (1.0 + math.exp(-(4.0 * (lm + 0.6) - 2.0 * code_after)))


def expected_show_reward(features: dict[str, float | str]) -> float:
    if float(features["suggestion_chars"]) <= 0:
        return 0.0
    p = p_accept(features)
    return p * (1.0 + LAMBDA) - LAMBDA


def make_context(rng: random.Random) -> dict[str, float | str]:
    """One decision's features from a synthetic request and generation."""
    tokens = rng.randint(1, 24)
    centre = rng.uniform(-2.0, 0.0)
    logprobs = [min(0.0, rng.gauss(centre, 0.3)) for _ in range(tokens)]
    code_after = rng.random() < 0.3
    indent = " " * (4 * rng.randint(0, 3))
    request = CompletionRequest(
        prefix="x = 1\n" * rng.randint(0, 40) + indent + "value = ",
        suffix=("compute()" if code_after else "") + "\n" + "y = 2\n" * rng.randint(0, 40),
        language=rng.choice(LANGUAGES),
        trigger="invoked" if rng.random() < 0.1 else "automatic",
    )
    empty = rng.random() < 0.05
    text = "" if empty else "a" * rng.randint(2, 80)
    signals = Signals(
        typing_speed_cps=rng.uniform(0, 10),
        seconds_since_last_accept=rng.expovariate(1 / 60),
        recent_accept_rate=rng.random(),
    )
    return extract_features(request, text, Generation(text, logprobs), signals)


def contexts(n: int, seed: int) -> list[dict[str, float | str]]:
    rng = random.Random(seed)
    return [make_context(rng) for _ in range(n)]


def true_value(policy: Policy, features: list[dict[str, float | str]]) -> float:
    """Exact expected reward per request of `policy` over these contexts."""
    p = policy.p_show_batch(features)
    r = np.array([expected_show_reward(f) for f in features])
    return float(np.mean(p * r))


def optimal_value(features: list[dict[str, float | str]], floor: float = 0.0) -> float:
    """Value of the best policy that still shows every suggestion with probability >= floor."""
    rewards = np.array([expected_show_reward(f) for f in features])
    return float(np.mean(np.where(rewards > 0, rewards, floor * rewards)))


@dataclass
class Logger:
    """Runs a logging policy in the synthetic world and records what the trainer sees."""

    policy: Policy
    seed: int = 0

    def log(
        self, features: list[dict[str, float | str]], start: datetime | None = None
    ) -> list[LoggedDecision]:
        rng = random.Random(self.seed)
        start = start or datetime(2026, 1, 1, tzinfo=UTC)
        logged = []
        for i, f in enumerate(features):
            action, propensity = self.policy.decide(f, rng)
            reward = 0.0
            if action == "show":
                reward = 1.0 if rng.random() < p_accept(f) else -LAMBDA
            logged.append(
                LoggedDecision(
                    decision_id=f"d{i}",
                    time=start + timedelta(seconds=i),
                    policy_version=self.policy.version,
                    action=action,
                    propensity=propensity,
                    reward=reward,
                    features=f,
                )
            )
        return logged


def to_events(logged: list[LoggedDecision]) -> list[dict[str, object]]:
    """The telemetry events a client would have sent for these decisions, as JSON."""
    from telemetry.events import DecisionEvent, OutcomeEvent, RetentionEvent

    events: list[dict[str, object]] = []
    for d in logged:
        chars = int(float(d.features["suggestion_chars"]))
        events.append(
            DecisionEvent(
                decision_id=d.decision_id,
                session_id="s",
                install_id="i",
                language=str(d.features["language"]),
                trigger="automatic",
                policy_version=d.policy_version,
                model_id="synthetic",
                action="show" if d.shown else "silence",
                propensity=d.propensity,
                features=dict(d.features),
                suggestion_chars=chars,
                time=d.time,
            ).model_dump(mode="json")
        )
        if not d.shown:
            continue
        accepted = d.reward > 0
        events.append(
            OutcomeEvent(
                decision_id=d.decision_id,
                kind="accepted" if accepted else "ignored",
                accepted_chars=chars if accepted else None,
                time=d.time,
            ).model_dump(mode="json")
        )
        if accepted:
            events.append(
                RetentionEvent(
                    decision_id=d.decision_id,
                    after_s=120,
                    accepted_chars=chars,
                    retained_chars=chars,
                    time=d.time,
                ).model_dump(mode="json")
            )
    return events
