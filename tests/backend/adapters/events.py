"""Text-carrying events posted to the real backend, as an editor at telemetry level `full` sends
them, for the tenant adapter tests."""

from __future__ import annotations

import gzip
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from telemetry.events import DecisionEvent, OutcomeEvent, RetentionEvent
from tests.support.backend_server import BackendServer

START = datetime.now(UTC).replace(microsecond=0) - timedelta(days=1)  # ingest bounds times
OUTCOME_CHARS = {"accepted": None, "partial": 3, "ignored": None, "dismissed": None}


@dataclass(frozen=True)
class Logged:
    """One decision as posted: what the example built from it must be."""

    decision_id: str
    minute: int
    prompt: str | None
    suggestion: str
    outcome: str | None
    propensity: float
    action: str = "show"


def decision(item: Logged) -> dict[str, Any]:
    event = DecisionEvent(
        decision_id=item.decision_id,
        session_id="s1",
        install_id="i1",
        language="python",
        trigger="automatic",
        policy_version="builtin",
        model_id="tiny",
        action=item.action,
        propensity=item.propensity,
        suggestion_chars=len(item.suggestion) if item.action == "show" else 0,
        prompt=item.prompt,
        suggestion=item.suggestion if item.prompt is not None else None,
        time=START + timedelta(minutes=item.minute),
    )
    return event.model_dump(mode="json")


def outcome(item: Logged) -> dict[str, Any] | None:
    if item.outcome is None:
        return None
    chars = len(item.suggestion) if item.outcome == "accepted" else OUTCOME_CHARS.get(item.outcome)
    event = OutcomeEvent(
        decision_id=item.decision_id,
        kind=item.outcome,
        accepted_chars=chars,
        time=START + timedelta(minutes=item.minute, seconds=5),
    )
    return event.model_dump(mode="json")


def retention(item: Logged, after_s: int, retained_chars: int) -> dict[str, Any]:
    """How much of the accepted `item` was still there `after_s` seconds later."""
    accepted = len(item.suggestion) if item.outcome == "accepted" else OUTCOME_CHARS[item.outcome]
    event = RetentionEvent(
        decision_id=item.decision_id,
        after_s=after_s,  # type: ignore[arg-type]
        accepted_chars=accepted or 0,
        retained_chars=retained_chars,
        time=START + timedelta(minutes=item.minute, seconds=5 + after_s),
    )
    return event.model_dump(mode="json")


def post(
    backend: BackendServer, items: list[Logged], later: list[dict[str, Any]] | None = None
) -> None:
    """Post the decisions and their outcomes through `/v1/events`, outcomes in a later batch
    (and `later` events, such as retention checkpoints, after them)."""
    decisions = [decision(i) for i in items]
    outcomes = [o for o in (outcome(i) for i in items) if o is not None]
    for events in (decisions, outcomes, later or []):
        for start in range(0, len(events), 100):
            body = json.dumps({"events": events[start : start + 100]}).encode()
            response = httpx.post(
                backend.url + "/v1/events",
                content=gzip.compress(body),
                headers={
                    "Authorization": f"Bearer {backend.token}",
                    "Content-Type": "application/json",
                    "Content-Encoding": "gzip",
                },
                timeout=30,
            )
            response.raise_for_status()
            assert len(response.json()["accepted"]) == len(events[start : start + 100]), (
                response.text
            )


def logged(
    count: int, *, text: bool = True, outcomes: tuple[str, ...] | None = None
) -> list[Logged]:
    """`count` shown decisions a minute apart, posted in a shuffled order of time (so row order
    and time order differ), cycling through `outcomes`."""
    kinds = outcomes or ("accepted", "ignored", "partial", "dismissed", "accepted")
    # Even minutes first, then odd ones: row order is not time order.
    minutes = [*range(0, count, 2), *range(1, count, 2)]
    items = []
    for k, minute in enumerate(minutes):
        name = f"value_{minute}"
        items.append(
            Logged(
                decision_id=uuid.uuid4().hex,
                minute=minute,
                prompt=f"def compute_{minute}(x):\n    {name} = x * {minute}\n    return "
                if text
                else None,
                suggestion=f"{name} + {k}\n",
                outcome=kinds[k % len(kinds)],
                propensity=0.02 if k % 3 == 0 else 0.5,
            )
        )
    return items
