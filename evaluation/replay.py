"""`tabloop eval replay`: the whole learning loop, replayed on real files, measured.

    tabloop eval replay --train DIR --test DIR --rounds R --json

Each round, at sampled positions in the training corpus (as if the rest of the file had not been
typed yet), the real engine produces a suggestion and the serving policy decides; a simulated
user accepts what matches the file, takes right prefixes, and ignores the rest. Decisions,
outcomes and retention go through the real telemetry client to the real backend on loopback,
whose scheduled trainer learns and promotes; the policy client picks the new version up, and the
next round runs on it. At the end the always-show baseline, the built-in policy and the learned
policy are played on the held-out corpus (its events are not sent, so nothing learns from it).

Model outputs are cached by prompt hash (`--cache`), so only the first pass runs the model.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from backend.local import LocalBackend
from backend.policy.dataset import latest_event_id
from backend.policy.loop import TrainingScheduler
from backend.policy.settings import TrainerSettings
from common.config import configured_cache_dir
from completion.engine import Engine
from completion.gate import Policy, Signals, builtin_policy
from completion.output_cache import CachedRunner
from completion.policy_client import PolicyClient
from completion.settings import CompletionSettings
from completion.types import Decision
from evaluation.simulation import (
    Position,
    UserResponse,
    sample_positions,
    simulated_user,
)
from telemetry.client import TelemetryClient
from telemetry.events import DecisionEvent, OutcomeEvent, RetentionEvent
from telemetry.settings import TelemetrySettings

log = logging.getLogger(__name__)

SECONDS_PER_CHAR = 0.2  # the simulated typist: 5 characters a second between positions


@dataclass
class Tally:
    """What users saw and kept, summed over positions (and over draws)."""

    requests: int = 0
    suggestions: int = 0  # non-empty suggestions produced
    shown: int = 0
    accepted: int = 0  # accepted whole or in part
    accepted_chars: int = 0
    retained_chars: int = 0
    reward: float = 0.0

    def add(
        self, response: UserResponse | None, shown: bool, had_text: bool, reward: float
    ) -> None:
        self.requests += 1
        self.suggestions += had_text
        self.shown += shown
        self.reward += reward
        if response is not None and response.kind != "ignored":
            self.accepted += 1
            self.accepted_chars += response.accepted_chars
            self.retained_chars += response.retained_chars

    def report(self, draws: int = 1) -> dict[str, float]:
        """Per-draw figures (sums divided by the number of draws)."""
        return {
            "requests": self.requests / draws,
            "suggestions": self.suggestions / draws,
            "shown": self.shown / draws,
            "accept_rate": self.accepted / self.shown if self.shown else 0.0,
            "accepted_chars": self.accepted_chars / draws,
            "retained_chars": self.retained_chars / draws,
            "reward": self.reward / draws,
            "reward_per_request": self.reward / self.requests if self.requests else 0.0,
        }


@dataclass
class Session:
    """The simulated user's state that the server would observe (the `Signals`)."""

    clock_s: float = 0.0
    last_accept_s: float = -1e6
    recent: list[bool] = field(default_factory=list)

    def signals(self) -> Signals:
        rate = sum(self.recent) / len(self.recent) if self.recent else 0.0
        return Signals(
            typing_speed_cps=1.0 / SECONDS_PER_CHAR,
            seconds_since_last_accept=min(self.clock_s - self.last_accept_s, 1e6),
            recent_accept_rate=rate,
        )

    def observe(self, accepted: bool) -> None:
        self.recent = [*self.recent[-19:], accepted]
        if accepted:
            self.last_accept_s = self.clock_s


def reward_of(response: UserResponse, suggestion_chars: int, distraction_cost: float) -> float:
    """The reward the trainer computes from the events of this response (see rewards.py)."""
    if response.kind == "ignored":
        return -distraction_cost
    retained = response.retained_chars / response.accepted_chars if response.accepted_chars else 0
    if response.kind == "accepted":
        return retained
    return min(1.0, response.accepted_chars / suggestion_chars) * retained


class Player:
    """Plays positions through the engine and the simulated user, optionally reporting events."""

    def __init__(
        self,
        engine: Engine,
        telemetry: TelemetryClient | None,
        distraction_cost: float,
        min_partial_chars: int,
    ) -> None:
        self.engine = engine
        self.telemetry = telemetry
        self.distraction_cost = distraction_cost
        self.min_partial_chars = min_partial_chars
        self.last_event_at = 0.0
        # When a list, every decision is kept here with the user's response (None: not shown).
        self.log: list[tuple[Decision, UserResponse | None]] | None = None

    def play(self, positions: list[Position]) -> Tally:
        tally = Tally()
        session = Session()
        current_path = ""
        previous_end = 0
        for position in positions:
            if position.path != current_path:  # a new file: a new stretch of typing
                current_path, previous_end, session = position.path, 0, Session()
            session.clock_s += SECONDS_PER_CHAR * max(0, len(position.prefix) - previous_end)
            previous_end = len(position.prefix)
            request = position.request()
            decision = self.engine.complete(request, signals=session.signals())
            response: UserResponse | None = None
            reward = 0.0
            if decision.shown:
                response = simulated_user(decision.text, position.hole, self.min_partial_chars)
                reward = reward_of(response, len(decision.text), self.distraction_cost)
                session.observe(response.kind != "ignored")
            tally.add(response, decision.shown, bool(decision.text), reward)
            if self.log is not None:
                self.log.append((decision, response))
            if self.telemetry is not None:
                self._report(decision, position, response)
        return tally

    def _report(
        self, decision: Decision, position: Position, response: UserResponse | None
    ) -> None:
        assert self.telemetry is not None
        text = decision.text
        self.telemetry.record(
            DecisionEvent(
                decision_id=decision.decision_id,
                session_id=self.telemetry.session_id,
                install_id=self.telemetry.install_id,
                language=position.language,
                trigger="automatic",
                policy_version=decision.policy_version,
                model_id=decision.model_id[:200],
                action=decision.action,
                propensity=decision.propensity,
                features=decision.features,
                suggestion_chars=len(text),
                suggestion_lines=text.count("\n") + 1 if text else 0,
                cache_hit=decision.cache_hit,
            )
        )
        if response is not None:
            partial = response.kind == "partial"
            self.telemetry.record(
                OutcomeEvent(
                    decision_id=decision.decision_id,
                    kind=response.kind,
                    accepted_chars=None if response.kind == "ignored" else response.accepted_chars,
                    reason="diverged" if response.kind == "ignored" else None,
                )
            )
            if response.kind == "accepted" or partial:
                self.telemetry.record(
                    RetentionEvent(
                        decision_id=decision.decision_id,
                        after_s=120,
                        accepted_chars=response.accepted_chars,
                        retained_chars=response.retained_chars,
                    )
                )
        self.last_event_at = time.time()


def always_show() -> Policy:
    """The baseline: every non-empty suggestion is shown."""
    return builtin_policy(show_floor=1.0).derive("always-show")


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


def _change_pct(new: float, old: float) -> float | None:
    return round(100.0 * (new - old) / old, 2) if old else None


def _changes(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """A policy's figures against the always-show baseline's, on the same positions."""
    return {
        "baseline": base,
        "learned": new,
        "shown_change_pct": _change_pct(new["shown"], base["shown"]),
        "accept_rate_change_pct": _change_pct(new["accept_rate"], base["accept_rate"]),
        "accepted_chars_change_pct": _change_pct(new["accepted_chars"], base["accepted_chars"]),
        "retained_chars_change_pct": _change_pct(new["retained_chars"], base["retained_chars"]),
        "reward_change": round(new["reward"] - base["reward"], 3),
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tabloop eval replay",
        description="Replay the learning loop on real files and report what it changed.",
    )
    parser.add_argument("--train", type=Path, required=True, help="corpus the loop learns on")
    parser.add_argument("--test", type=Path, required=True, help="held-out corpus to report on")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--train-positions", type=int, default=300)
    parser.add_argument("--test-positions", type=int, default=200)
    parser.add_argument("--model", default="bundled", help="completion model (see settings)")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--context-tokens", type=int, default=512)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads (0: every core but one)"
    )
    parser.add_argument("--cache", type=Path, default=None, help="model output cache file")
    parser.add_argument("--lambda", dest="distraction_cost", type=float, default=0.25)
    parser.add_argument("--min-partial-chars", type=int, default=4)
    parser.add_argument("--train-interval", type=float, default=10.0, help="trainer period, s")
    parser.add_argument("--refresh", type=float, default=2.0, help="policy client period, s")
    parser.add_argument("--eval-draws", type=int, default=5, help="plays of the held-out set")
    parser.add_argument(
        "--min-ess", type=float, default=None, help="promotion's effective sample size floor"
    )
    parser.add_argument(
        "--hidden", type=int, default=None, help="hidden units of the policy (0: logistic)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return parser


def main(argv: list[str]) -> int:
    """Entry point of `tabloop eval replay`."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    report = run(args, argv)
    text = json.dumps(report, indent=2)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    if args.json:
        print(text)
    else:
        for key, value in report["summary"].items():
            print(f"{key}: {value}")
    return 0


def engine_settings(args: argparse.Namespace) -> CompletionSettings:
    """The engine's settings for replayed positions, from the command line."""
    return CompletionSettings(
        model=args.model,
        max_new_tokens=args.max_new_tokens,
        context_tokens=args.context_tokens,
        threads=args.threads,
        # No typing-through cache: every position asks the model (through the output cache),
        # so a decision never depends on which positions happened to come before it.
        cache=False,
    )


def load_cached_runner(args: argparse.Namespace, settings: CompletionSettings) -> CachedRunner:
    """The configured model behind the output cache (`--cache`, else one in the cache dir)."""
    from completion.runners import load_runner

    cache_dir = configured_cache_dir()  # where the configured model's weights already are
    runner = load_runner(settings, cache_dir)
    return CachedRunner(runner, args.cache or cache_dir / "replay" / "generations.jsonl")


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """The replay; returns its report."""
    started = time.time()
    train_positions = sample_positions(args.train, args.train_positions, args.seed)
    test_positions = sample_positions(args.test, args.test_positions, args.seed + 1)
    settings = engine_settings(args)
    overrides: dict[str, Any] = {
        "interval_s": args.train_interval,
        "min_events": min(200, len(train_positions)),
        "seed": args.seed,
        "rewards": {"distraction_cost": args.distraction_cost},
    }
    if args.min_ess is not None:
        overrides["min_ess"] = args.min_ess
    if args.hidden is not None:
        overrides["hidden"] = args.hidden
    trainer_settings = TrainerSettings.model_validate(overrides)
    with tempfile.TemporaryDirectory(prefix="tabloop-replay-") as tmp:
        work = Path(tmp)
        runner = load_cached_runner(args, settings.model_copy(update={"cache": True}))
        backend = LocalBackend(tenant="replay", trainer=trainer_settings)
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
        policies = PolicyClient(backend.url, backend.token, work / "policy", args.refresh)
        policies.start()
        try:
            rounds = _rounds(
                args, train_positions, runner, settings, telemetry, policies, scheduler, backend
            )
            learned = policies.current()
            evaluation = {
                name: _evaluate(args, test_positions, runner, settings, policy)
                for name, policy in (
                    ("always_show", always_show()),
                    ("builtin", builtin_policy()),
                    ("learned", learned),
                )
            }
            # The same comparison on the positions it learned from, to show how well it carries
            # over (and to choose settings such as λ without looking at the held-out corpus).
            seen = {
                name: _evaluate(args, train_positions, runner, settings, policy)
                for name, policy in (("always_show", always_show()), ("learned", learned))
            }
        finally:
            policies.close()
            telemetry.shutdown(5.0)
            backend.stop()
            runner.close()
    delays = [r["event_to_serving_s"] for r in rounds if r["event_to_serving_s"] is not None]
    summary = {
        **_changes(evaluation["always_show"], evaluation["learned"]),
        "learned_version": learned.version,
        "event_to_serving_s": max(delays) if delays else None,
    }
    return {
        "command": "tabloop eval replay " + " ".join(argv),
        "corpus": {
            "train": str(args.train),
            "test": str(args.test),
            "train_positions": len(train_positions),
            "test_positions": len(test_positions),
            "train_files": len({p.path for p in train_positions}),
            "test_files": len({p.path for p in test_positions}),
        },
        "model": runner.model_id,
        "settings": {
            "max_new_tokens": args.max_new_tokens,
            "context_tokens": args.context_tokens,
            "threads": args.threads,
            "lambda": args.distraction_cost,
            "show_floor": trainer_settings.show_floor,
            "min_ess": trainer_settings.min_ess,
            "hidden": trainer_settings.hidden,
            "train_interval_s": args.train_interval,
            "policy_refresh_s": args.refresh,
            "eval_draws": args.eval_draws,
            "seed": args.seed,
        },
        "model_cache": {"hits": runner.hits, "misses": runner.misses},
        "summary": summary,
        "held_out": evaluation,
        "training_corpus": _changes(seen["always_show"], seen["learned"]),
        "rounds": rounds,
        "wall_s": round(time.time() - started, 1),
    }


def _rounds(
    args: argparse.Namespace,
    positions: list[Position],
    runner: CachedRunner,
    settings: CompletionSettings,
    telemetry: TelemetryClient,
    policies: PolicyClient,
    scheduler: TrainingScheduler,
    backend: LocalBackend,
) -> list[dict[str, Any]]:
    rounds = []
    for number in range(1, args.rounds + 1):
        serving = policies.current()
        engine = Engine(settings, runner, policy_source=policies.current, seed=args.seed + number)
        player = Player(engine, telemetry, args.distraction_cost, args.min_partial_chars)
        tally = player.play(positions)
        last_event = player.last_event_at
        delivered = deliver(telemetry)
        newest = latest_event_id(backend.storage, backend.principal.tenant_id)
        promoted, event_to_serving, run_report = _await_training(
            scheduler, policies, newest, last_event, args
        )
        rounds.append(
            {
                "round": number,
                "policy": serving.version,
                "delivered": delivered,
                **tally.report(),
                "trained": run_report,
                "promoted": promoted,
                "event_to_serving_s": event_to_serving,
            }
        )
        log.warning("round %d: %s", number, json.dumps(rounds[-1]["trained"])[:300])
    return rounds


def _await_training(
    scheduler: TrainingScheduler,
    policies: PolicyClient,
    newest: int,
    last_event: float,
    args: argparse.Namespace,
) -> tuple[str | None, float | None, dict[str, Any]]:
    """Wait for the first scheduled run that read all of the round's events (up to event row
    `newest`), and for its policy to serve; the delay is measured from the round's last event."""
    deadline = time.monotonic() + 10 * args.train_interval + 600
    summary = None
    while time.monotonic() < deadline:
        fresh = [s for s in scheduler.runs if s.through_event_id >= newest]
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
    }
    if not summary.promoted:
        return None, None, report
    while time.monotonic() < deadline:
        if policies.current().version == summary.candidate:
            return summary.candidate, round(time.time() - last_event, 2), report
        time.sleep(0.02)
    return summary.candidate, None, report


def _evaluate(
    args: argparse.Namespace,
    positions: list[Position],
    runner: CachedRunner,
    settings: CompletionSettings,
    policy: Policy,
) -> dict[str, Any]:
    tally = Tally()
    for draw in range(args.eval_draws):
        engine = Engine(settings, runner, policy_source=lambda: policy, seed=10_000 + draw)
        played = Player(engine, None, args.distraction_cost, args.min_partial_chars).play(positions)
        for key, value in asdict(played).items():
            setattr(tally, key, getattr(tally, key) + value)
    figures = tally.report(args.eval_draws)
    return {"version": policy.version, **{k: round(v, 4) for k, v in figures.items()}}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
