"""The gate's learning loop on loopback, and its rounds.

`open_loop` starts what a user's server talks to (a local backend with its scheduled trainer), the
telemetry client that reports to it and the policy client that follows it. A round plays the
training positions with the serving policy, delivers the events, and waits for the trainer's run
that read them and for the policy client to serve what it promoted.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.adapters.scheduler import AdapterSchedule
from backend.local import LocalBackend
from backend.policy.dataset import event_time, latest_event_id
from backend.policy.loop import TrainingScheduler
from backend.policy.settings import TrainerSettings
from backend.settings import BackendSettings
from completion.engine import Engine
from completion.gate import CanaryPolicy
from completion.output_cache import CachedRunner
from completion.policy_client import PolicyClient
from completion.settings import CompletionSettings
from evaluation.replay.player import Player
from evaluation.simulation import Position
from telemetry.client import TelemetryClient
from telemetry.settings import TelemetrySettings
from training.feedback import FeedbackStore

log = logging.getLogger(__name__)

EXTRA_ROUNDS = 3


@dataclass(frozen=True)
class Loop:
    """The learning loop the rounds run on: the local backend and its scheduled trainer, the
    telemetry client that reports to it, the policy client that follows it."""

    backend: LocalBackend
    scheduler: TrainingScheduler
    telemetry: TelemetryClient
    policies: PolicyClient

    @property
    def tenant(self) -> int:
        return self.backend.principal.tenant_id


@contextmanager
def open_loop(work: Path, trainer: TrainerSettings, refresh_s: float) -> Iterator[Loop]:
    """The loop started on loopback (its state under `work`), stopped on leaving."""
    # The model learns in the replay's own loop (`model_loop`), never in its backend.
    settings = BackendSettings(trainer=trainer, train=True, adapters=AdapterSchedule.off())
    backend = LocalBackend(tenant="replay", settings=settings)
    scheduler = backend.services.trainer
    assert scheduler is not None  # asked for with the trainer settings
    backend.start()
    telemetry = TelemetryClient(
        TelemetrySettings(
            backend_url=backend.url, token=backend.token, flush_interval_s=0.5, batch_size=500
        ),
        work / "telemetry",
    )
    telemetry.start()
    policies = PolicyClient(backend.url, backend.token, work / "policy", refresh_s)
    policies.start()
    try:
        yield Loop(backend, scheduler, telemetry, policies)
    finally:
        policies.close()
        telemetry.shutdown(5.0)
        backend.stop()


def deliver(telemetry: TelemetryClient, timeout: float = 120.0) -> bool:
    """Wait until every recorded event has reached the backend."""
    telemetry.flush_to_spool(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if telemetry.spool is not None and len(telemetry.spool) == 0:
            return True
        if telemetry.sender is not None:
            telemetry.sender.wake()
        time.sleep(0.05)
    return False


def play_rounds(
    args: argparse.Namespace,
    loop: Loop,
    positions: list[Position],
    runner: CachedRunner,
    settings: CompletionSettings,
    feedback: FeedbackStore | None = None,
    count: int | None = None,
    first: int = 1,
) -> list[dict[str, Any]]:
    """`count` rounds (default `--rounds`) of the gate's loop on the training positions, numbered
    from `first`; the first round's shown suggestions and their outcomes go to `feedback` (each
    position once, as a user meets it once)."""
    rewards = loop.scheduler.settings.rewards
    registry = loop.scheduler.registry
    rounds: list[dict[str, Any]] = []
    wanted = args.rounds if count is None else count
    played = 0
    # The rounds asked for, then up to EXTRA_ROUNDS more while a canary waits for its verdict:
    # the loop ends with a version serving alone.
    while played < wanted or (
        registry.canary(loop.tenant) is not None and played < wanted + EXTRA_ROUNDS
    ):
        number = first + played
        played += 1
        serving = loop.policies.current()
        engine = Engine(
            settings, runner, policy_source=loop.policies.current, seed=args.seed + number
        )
        player = Player(
            engine,
            loop.telemetry,
            rewards,
            args.min_partial_chars,
            feedback=feedback if played == 1 else None,
        )
        tally = player.play(positions)
        last_event = player.last_event_at
        delivered = deliver(loop.telemetry)
        newest = latest_event_id(loop.backend.storage, loop.tenant)
        promoted, event_to_serving, run_report = await_training(loop, newest, last_event, args)
        rounds.append(
            {
                "round": number,
                "policy": serving.version,
                "delivered": delivered,
                **tally.report(),
                "trained": run_report,
                "promoted": promoted,
                "event_to_serving_s": event_to_serving,
                "canary_share": serving.share if isinstance(serving, CanaryPolicy) else None,
            }
        )
        log.warning("round %d: %s", number, json.dumps(rounds[-1]["trained"])[:300])
    return rounds


def await_training(
    loop: Loop, newest: int, last_event: float, args: argparse.Namespace
) -> tuple[str | None, float | None, dict[str, Any]]:
    """Wait for the first scheduled run that read all of the round's events (up to event row
    `newest`), and for its policy to serve; the delay is measured from the round's last event."""
    deadline = time.monotonic() + 10 * args.train_interval + 600
    summary = None
    while time.monotonic() < deadline:
        fresh = [s for s in loop.scheduler.runs if s.through_event_id >= newest]
        if fresh:
            summary = fresh[0]
            break
        time.sleep(0.05)
    if summary is None:
        return None, None, {"error": "no training run"}
    report = {
        "candidate": summary.candidate,
        "promoted": summary.promoted,
        "events": summary.events,
        "seconds": round(summary.finished_at - summary.started_at, 2),
        "gain": summary.report.get("gain"),
        "gain_stderr": summary.report.get("gain_stderr"),
        "reasons": summary.report.get("reasons"),
        "candidate_shown_rate": summary.report.get("candidate", {}).get("shown_rate"),
        "state": summary.state,
        "canary": summary.canary,
        "pruned": summary.report.get("pruned"),
    }
    if not summary.promoted:
        return None, None, report
    while time.monotonic() < deadline:
        if loop.policies.current().version == summary.candidate:
            return summary.candidate, round(time.time() - last_event, 2), report
        time.sleep(0.02)
    return summary.candidate, None, report


def promotions(loop: Loop, drill_version: str | None) -> list[dict[str, Any]]:
    """Each promoted candidate (not the canary drill's) with the delay from the newest event its
    run read to its first serving by the policy client (None if it never served there)."""
    found = []
    for run in loop.scheduler.runs:
        if not run.promoted or run.candidate is None or run.candidate == drill_version:
            continue
        newest = event_time(loop.backend.storage, loop.tenant, run.through_event_id)
        served = loop.policies.first_served.get(run.candidate)
        found.append(
            {
                "version": run.candidate,
                "events": run.events,
                "state": run.state,
                "event_to_serving_s": (
                    round(served - newest, 2) if served is not None and newest else None
                ),
            }
        )
    return found
