"""A generated history of one tenant for the dashboard's tests: several policy versions, a
promotion, a rollback, two languages and two editors, over the last 20 hours.

Events go through the real `POST /v1/events` (so ingestion is counted too); the registry is
changed through the registry's own code and its history rows are then dated back to when the
events say each version served. `expected_summary()` recomputes the Overview's totals from the
generated events in Python, independently of the SQL.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import update

from backend.policy.models import PolicyPromotionRow
from backend.policy.registry import PolicyRegistry
from backend.storage import Storage
from completion.gate import builtin_policy

LANGUAGES = ("python", "typescript")
EDITORS = (("vscode", "1.96.0"), ("neovim", "0.12.0"))
HOURS = 20


@dataclass
class History:
    """What was generated: the events, when each version served, and the registry actions."""

    events: list[dict[str, Any]] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    actions: list[tuple[str, str, datetime]] = field(default_factory=list)  # action, version, at


def _report(rng: random.Random, gain: float) -> dict[str, Any]:
    dr = 0.2 + gain
    return {
        "train_events": 4000,
        "holdout_events": 1000,
        "candidate": {
            "dr": {"value": dr, "stderr": 0.01, "ess": 640.0 + rng.randint(0, 200)},
            "snips": {"value": dr - 0.004, "stderr": 0.012, "ess": 610.0},
            "ips": {"value": dr + 0.003, "stderr": 0.02, "ess": 600.0},
            "shown_rate": 0.55 + gain,
            "show_probability": 0.57,
        },
        "serving": {"version": "builtin", "dr": {"value": 0.2, "stderr": 0.01, "ess": 700.0}},
        "gain": gain,
        "gain_stderr": 0.008,
        "enough_signal": True,
        "promote": gain > 0,
        "reasons": [] if gain > 0 else [f"gain {gain:+.4f} below the margin 0.0"],
    }


def serving_at(history: History, at: datetime) -> str:
    version = "builtin"
    for _action, name, when in history.actions:
        if when <= at:
            version = name
    return version


def generate(
    storage: Storage,
    tenant_id: int,
    *,
    now: datetime | None = None,
    seed: int = 17,
    requests_per_hour: int = 40,
) -> History:
    """Add three versions to the registry, promote v1, promote v2, roll v2 back, date those
    actions 16, 9 and 4 hours ago, and make the events of the last 20 hours to match."""
    rng = random.Random(seed)
    now = now or datetime.now(UTC)
    registry = PolicyRegistry(storage)
    history = History()
    for gain in (0.03, 0.05, -0.01):
        history.versions.append(
            registry.add(tenant_id, builtin_policy().derive, _report(rng, gain)).version
        )
    v1, v2, _v3 = history.versions
    registry.promote(tenant_id, v1, actor="token:alice", reason="promoted by hand")
    registry.promote(tenant_id, v2, actor="trainer", reason="gain +0.05")
    registry.rollback(tenant_id, actor="token:bob", reason="accept rate dropped")
    times = [now - timedelta(hours=16), now - timedelta(hours=9), now - timedelta(hours=4)]
    with storage.session() as session:
        rows = session.scalars(
            PolicyPromotionRow.__table__.select()
            .with_only_columns(PolicyPromotionRow.id)
            .where(PolicyPromotionRow.tenant_id == tenant_id)
            .order_by(PolicyPromotionRow.id)
        ).all()
        for row_id, at in zip(rows, times, strict=True):
            session.execute(
                update(PolicyPromotionRow)
                .where(PolicyPromotionRow.id == row_id)
                .values(created_at=at)
            )
        session.commit()
    history.actions = [
        ("promote", v1, times[0]),
        ("promote", v2, times[1]),
        ("rollback", v1, times[2]),
    ]

    for hour in range(HOURS, 0, -1):
        for _ in range(requests_per_hour):
            # The newest event of a request, its last retention check, comes 602 s after it:
            # none lies ahead of `now`, so totals over a window ending now stay as they are
            # while a test reads them twice (the page, then the endpoint).
            at = now - timedelta(hours=hour) + timedelta(seconds=rng.uniform(0, 3590 - 602))
            history.events.extend(_request(rng, at, serving_at(history, at), now=now))
    return history


def _request(
    rng: random.Random, at: datetime, version: str, *, now: datetime
) -> list[dict[str, Any]]:
    language = LANGUAGES[rng.random() < 0.35]
    editor, editor_version = EDITORS[rng.random() < 0.4]
    # Adapter v0001 serves; for the last 6 hours v0002 is a canary on the Neovim installation.
    canary = editor == "neovim" and at > now - timedelta(hours=6)
    decision_id = uuid.uuid4().hex
    show = rng.random() < (0.62 if version != "builtin" else 0.5)
    chars = rng.randint(5, 120)
    decision: dict[str, Any] = {
        "type": "decision",
        "schema_version": 2,
        "event_id": str(uuid.uuid4()),
        "time": at.isoformat(),
        "decision_id": decision_id,
        "session_id": "s1",
        "install_id": f"install-{editor}",
        "language": language,
        "trigger": "automatic",
        "policy_version": version,
        "model_id": "tiny",
        "model_version": "v0002" if canary else "v0001",
        "action": "show" if show else "silence",
        "propensity": 0.9,
        "suggestion_chars": chars if show else 0,
        "latency": {"total_ms": rng.choice((12.0, 40.0, 80.0, 140.0, 260.0, 900.0))},
        "client_name": editor,
        "client_version": editor_version,
    }
    if not show:
        decision["silence_reason"] = rng.choice(("policy", "policy", "empty", "latency"))
    events = [decision]
    if not show:
        return events
    roll = rng.random()
    later = at + timedelta(seconds=2)
    if roll < 0.35:
        kind, accepted = "accepted", chars
    elif roll < 0.45:
        kind, accepted = "partial", chars // 2
    else:
        kind, accepted = "ignored", None
    outcome: dict[str, Any] = {
        "type": "outcome",
        "schema_version": 2,
        "event_id": str(uuid.uuid4()),
        "time": later.isoformat(),
        "decision_id": decision_id,
        "kind": kind,
    }
    if accepted is not None:
        outcome["accepted_chars"] = accepted
    else:
        outcome["reason"] = "diverged"
    events.append(outcome)
    if accepted:
        kept = accepted
        for after_s in (30, 120, 600):
            kept = max(0, kept - rng.randint(0, 5))
            events.append(
                {
                    "type": "retention",
                    "schema_version": 2,
                    "event_id": str(uuid.uuid4()),
                    "time": (later + timedelta(seconds=after_s)).isoformat(),
                    "decision_id": decision_id,
                    "after_s": after_s,
                    "accepted_chars": accepted,
                    "retained_chars": kept,
                }
            )
    return events


def post(url: str, token: str, events: list[dict[str, Any]], *, install_id: str = "i-1") -> None:
    """Send `events` in batches of 500 through the real API, with a spool report each."""
    headers = {"Authorization": f"Bearer {token}"}
    for start in range(0, len(events), 500):
        batch = events[start : start + 500]
        meta = {
            "install_id": install_id,
            "spool_backlog": max(0, len(events) - start - len(batch)),
            "spool_dropped": 3,
        }
        response = httpx.post(
            f"{url}/v1/events", json={"events": batch, "meta": meta}, headers=headers, timeout=60
        )
        response.raise_for_status()
        rejected = response.json()["rejected"]
        assert not rejected, rejected[:3]


def expected_summary(events: list[dict[str, Any]], start: int, end: int) -> dict[str, Any]:
    """The Overview's totals over `[start, end)` (Unix seconds of bucket starts), in Python."""

    def bucket(event: dict[str, Any]) -> int:
        return int(datetime.fromisoformat(event["time"]).timestamp()) // 300 * 300

    inside = [e for e in events if start <= bucket(e) < end]
    decisions = [e for e in inside if e["type"] == "decision"]
    outcomes = [e for e in inside if e["type"] == "outcome"]
    retention = [e for e in inside if e["type"] == "retention"]
    shown = sum(1 for e in decisions if e["action"] == "show")
    accepted = sum(1 for e in outcomes if e["kind"] == "accepted")
    partial = sum(1 for e in outcomes if e["kind"] == "partial")
    return {
        "requests": len(decisions),
        "shown": shown,
        "shown_share": shown / len(decisions) if decisions else None,
        "accept_rate": accepted / shown if shown else None,
        "partial_rate": partial / shown if shown else None,
        "accepted_chars": sum(e.get("accepted_chars") or 0 for e in outcomes),
        "retained_600": sum(e["retained_chars"] for e in retention if e["after_s"] == 600),
        "silences": {
            reason: sum(1 for e in decisions if e.get("silence_reason") == reason)
            for reason in ("policy", "empty", "latency")
        },
    }
