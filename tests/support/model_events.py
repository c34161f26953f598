"""Shown decisions made by a model version, with what became of them, as an editor posts them
(`/v1/events`), for the tests of the model canary and of statistics by model version."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from telemetry.events import DecisionEvent, OutcomeEvent, RetentionEvent


def shown(
    model_version: str | None,
    kind: str,
    time: datetime,
    *,
    chars: int = 20,
    retained: bool = False,
) -> list[dict[str, Any]]:
    """One shown decision of `model_version` (None: an older client's, without one), its
    outcome `kind` a second later, and with `retained` the 120 s checkpoint of an accepted one
    (all of it kept); as JSON bodies."""
    decision_id = uuid.uuid4().hex
    events = [
        DecisionEvent(
            decision_id=decision_id,
            session_id="s",
            install_id=f"i-{model_version}",
            language="python",
            trigger="automatic",
            policy_version="builtin",
            model_id="base@1",
            model_version=model_version,
            action="show",
            propensity=1.0,
            suggestion_chars=chars,
            time=time,
        ).model_dump(mode="json", exclude_none=True),
        OutcomeEvent(
            decision_id=decision_id,
            kind=kind,
            accepted_chars=chars if kind == "accepted" else None,
            time=time + timedelta(seconds=1),
        ).model_dump(mode="json"),
    ]
    if retained and kind == "accepted":
        checkpoint = RetentionEvent(
            decision_id=decision_id,
            after_s=120,
            accepted_chars=chars,
            retained_chars=chars,
            time=time + timedelta(seconds=121),
        )
        events.append(checkpoint.model_dump(mode="json"))
    return events
