"""The canary drill: a candidate known to be bad goes into canary; does the loop roll it back?"""

from __future__ import annotations

import argparse
import time
from datetime import datetime
from typing import Any

from backend.policy.dataset import latest_event_id
from backend.policy.rewards import as_utc
from completion.engine import Engine
from completion.gate import Policy, ShowWeights
from completion.output_cache import CachedRunner
from completion.settings import CompletionSettings
from evaluation.replay.player import Player
from evaluation.replay.rounds import Loop, await_training, deliver
from evaluation.simulation import Position


def wrong_sign(policy: Policy, version: str) -> Policy:
    """`policy` with its logit negated: it shows what it would silence, and the reverse."""
    state = {
        name: -value if name.startswith(("linear.", "mlp_out.")) else value
        for name, value in policy.weights.state().items()
    }
    weights = ShowWeights.from_state(state, dim=policy.weights.dim, hidden=policy.weights.hidden)
    return policy.derive(
        version,
        weights=weights,
        metadata={"parent": policy.version, "description": "canary drill: the wrong sign"},
    )


def canary_drill(
    args: argparse.Namespace,
    loop: Loop,
    positions: list[Position],
    runner: CachedRunner,
    settings: CompletionSettings,
) -> dict[str, Any]:
    """A bad candidate goes into canary; rounds on the training positions judge it live. Reports
    whether the scheduled trainer rolled it back on its own, and how long it took."""
    scheduler, policies, tenant = loop.scheduler, loop.policies, loop.tenant
    registry = scheduler.registry
    serving = registry.serving_policy(tenant)
    bad = registry.add(tenant, lambda v: wrong_sign(serving, v), {"drill": "wrong sign"})
    share = scheduler.settings.canary_share or 0.1
    started = time.time()
    registry.start_canary(tenant, bad.version, share=share, actor="replay", reason="canary drill")
    rewards = scheduler.settings.rewards
    played = 0
    # Until the trainer settles it, or it has had the most decisions a canary may have.
    limit = scheduler.settings.canary_max_decisions + len(positions)
    number = 0
    while registry.canary(tenant) is not None and played < limit and positions:
        number += 1
        policies.refresh_now()
        engine = Engine(settings, runner, policy_source=policies.current, seed=777 + number)
        Player(engine, loop.telemetry, rewards, args.min_partial_chars).play(positions)
        played += len(positions)
        deliver(loop.telemetry)
        newest = latest_event_id(loop.backend.storage, tenant)
        await_training(loop, newest, time.time(), args)
    ended = [
        row
        for row in registry.history(tenant)
        if row["action"] in ("canary-rollback", "canary-promote")
        and as_utc(datetime.fromisoformat(row["at"])).timestamp() >= started - 1
    ]
    outcome = ended[-1] if ended else None
    return {
        "version": bad.version,
        "share": share,
        "rolled_back": outcome is not None and outcome["action"] == "canary-rollback",
        "outcome": outcome["action"] if outcome else "still running",
        "seconds_to_rollback": (
            round(as_utc(datetime.fromisoformat(outcome["at"])).timestamp() - started, 2)
            if outcome
            else None
        ),
        "decisions_played": played,
        "figures": outcome["figures"] if outcome else None,
    }
