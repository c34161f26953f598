"""`tabloop eval replay`: the whole learning loop, replayed on real files, measured.

    tabloop eval replay --train DIR --test DIR --rounds R --json

Each round, at sampled positions in the training corpus (as if the rest of the file had not been
typed yet), the real engine produces a suggestion and the serving policy decides; a simulated
user accepts what matches the file, takes right prefixes, and ignores the rest. Decisions,
outcomes and retention go through the real telemetry client to the real backend on loopback,
whose scheduled trainer learns and promotes; the policy client picks the new version up, and the
next round runs on it. At the end the always-show baseline, the built-in policy and the learned
policy are played on the held-out corpus (its events are not sent, so nothing learns from it).

With `--model-loop BUDGET` the model learns too, as it does on a user's machine: the first
round's shown suggestions and their outcomes are kept as the server keeps them
(`training.feedback`), an adapter is trained within the budget on the training corpus's code and
that feedback (`training.workspace.train_workspace`, what `tabloop train model` runs), the runner
serves it, and the held-out corpus is played again with the adapted model, shown always and
through the learned gate (`model_loop` in the report).

Model outputs are cached by prompt hash (`--cache`), so only the first pass runs the model.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from backend.local import LocalBackend
from backend.policy.dataset import event_time, latest_event_id
from backend.policy.loop import TrainingScheduler
from backend.policy.rewards import as_utc, outcome_reward
from backend.policy.settings import RewardSettings, TrainerSettings
from common.config import configured_cache_dir
from completion.engine import Engine
from completion.gate import CanaryPolicy, Policy, ShowWeights, builtin_policy
from completion.output_cache import CachedRunner
from completion.policy_client import PolicyClient
from completion.settings import CompletionSettings
from completion.types import Decision
from evaluation.editing import EditingSession
from evaluation.simulation import (
    Position,
    UserResponse,
    sample_positions,
    simulated_user,
)
from telemetry.client import TelemetryClient
from telemetry.events import OutcomeEvent
from telemetry.settings import TelemetrySettings
from training.examples import is_held_out
from training.feedback import FeedbackRecorder, FeedbackStore

log = logging.getLogger(__name__)

EXTRA_ROUNDS = 3


@dataclass
class Tally:
    """What users saw and kept, summed over positions (and over draws)."""

    requests: int = 0
    suggestions: int = 0  # non-empty suggestions produced
    shown: int = 0
    accepted: int = 0  # accepted whole or in part
    fully_accepted: int = 0
    partially_accepted: int = 0
    accepted_chars: int = 0
    retained_chars: int = 0
    reward: float = 0.0
    leading_whitespace: int = 0  # suggestions that start with a space or tab

    def add(self, response: UserResponse | None, shown: bool, text: str, reward: float) -> None:
        self.requests += 1
        self.suggestions += bool(text)
        self.leading_whitespace += text[:1] in (" ", "\t")
        self.shown += shown
        self.reward += reward
        if response is not None and response.kind != "ignored":
            self.accepted += 1
            self.fully_accepted += response.kind == "accepted"
            self.partially_accepted += response.kind == "partial"
            self.accepted_chars += response.accepted_chars
            self.retained_chars += response.retained_chars

    def report(self, draws: int = 1) -> dict[str, float]:
        """Per-draw figures (sums divided by the number of draws)."""
        return {
            "requests": self.requests / draws,
            "suggestions": self.suggestions / draws,
            "shown": self.shown / draws,
            "accept_rate": self.accepted / self.shown if self.shown else 0.0,
            "full_accept_rate": self.fully_accepted / self.shown if self.shown else 0.0,
            "partial_accept_rate": self.partially_accepted / self.shown if self.shown else 0.0,
            "leading_whitespace_share": (
                self.leading_whitespace / self.suggestions if self.suggestions else 0.0
            ),
            "accepted_chars": self.accepted_chars / draws,
            "retained_chars": self.retained_chars / draws,
            "reward": self.reward / draws,
            "reward_per_request": self.reward / self.requests if self.requests else 0.0,
        }


def reward_of(response: UserResponse, suggestion_chars: int, settings: RewardSettings) -> float:
    """The reward the trainer computes from the events of this response (`outcome_reward`)."""
    retained = response.retained_chars / response.accepted_chars if response.accepted_chars else 0
    reward = outcome_reward(
        response.kind, suggestion_chars, response.accepted_chars, retained, settings
    )
    assert reward is not None  # the simulated user always judges what it is shown
    return reward


class Player:
    """Plays positions through the engine and the simulated user, optionally reporting events.

    The user's session (signals, outcomes, retention, decision events) goes through the server's
    own code (`evaluation.editing.EditingSession`).
    """

    def __init__(
        self,
        engine: Engine,
        telemetry: TelemetryClient | None,
        rewards: RewardSettings,
        min_partial_chars: int,
        feedback: FeedbackStore | None = None,
    ) -> None:
        self.engine = engine
        self.telemetry = telemetry
        self.rewards = rewards
        self.min_partial_chars = min_partial_chars
        # Where shown suggestions and their outcomes are kept, as the server keeps them.
        self.feedback = feedback
        self.recorder = FeedbackRecorder()
        self.last_event_at = 0.0
        # When a list, every decision is kept here with the user's response (None: not shown).
        self.log: list[tuple[Decision, UserResponse | None]] | None = None
        self.session = EditingSession(
            session_id=telemetry.session_id if telemetry else "replay",
            install_id=telemetry.install_id if telemetry else "replay",
        )

    def play(self, positions: list[Position]) -> Tally:
        tally = Tally()
        session = self.session
        for position in positions:
            signals = session.arrive(position)
            request = position.request()
            decision = self.engine.complete(request, signals=signals)
            session.decided(position, request, decision)
            if self.feedback is not None:
                self.recorder.shown(decision, request)
            response: UserResponse | None = None
            reward = 0.0
            if decision.shown:
                response = simulated_user(decision.text, position.hole, self.min_partial_chars)
                reward = reward_of(response, len(decision.text), self.rewards)
                session.respond(position, decision, response)
            tally.add(response, decision.shown, decision.text, reward)
            if self.log is not None:
                self.log.append((decision, response))
            if self.feedback is not None:
                self._keep_feedback(session.events)
            if self.telemetry is not None:
                for event in session.events:
                    self.telemetry.record(event)
                self.last_event_at = time.time()
            session.events.clear()
        return tally

    def _keep_feedback(self, events: list[Any]) -> None:
        assert self.feedback is not None
        for event in events:
            if isinstance(event, OutcomeEvent) and (row := self.recorder.settled(event)):
                self.feedback.record(row)


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
    """A policy's figures against a baseline's (always-show unless said), on the same positions.

    `reward_gain_lower_bound` is the one-sided 95% lower bound of the reward gain: the gain less
    1.64 standard errors of the paired per-position gains over the held-out plays.
    """
    gains = [a - b for a, b in zip(new["position_rewards"], base["position_rewards"], strict=True)]
    n = len(gains)
    gain = sum(gains)
    mean = gain / n if n else 0.0
    variance = sum((g - mean) ** 2 for g in gains) / (n - 1) if n > 1 else 0.0
    stderr = math.sqrt(variance * n)  # of the sum over positions
    figures = ("shown", "accept_rate", "full_accept_rate", "accepted_chars", "retained_chars")
    return {
        "baseline": _public(base),
        "learned": _public(new),
        **{f"{name}_change_pct": _change_pct(new[name], base[name]) for name in figures},
        "reward_change": round(new["reward"] - base["reward"], 3),
        "reward_gain_stderr": round(stderr, 3),
        "reward_gain_lower_bound": round(gain - 1.64 * stderr, 3),
    }


def _public(figures: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in figures.items() if k != "position_rewards"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tabloop eval replay",
        description="Replay the learning loop on real files and report what it changed.",
    )
    parser.add_argument("--train", type=Path, required=True, help="corpus the loop learns on")
    parser.add_argument("--test", type=Path, default=None, help="held-out corpus to report on")
    parser.add_argument(
        "--held-out-split",
        action="store_true",
        help="instead of --test: report on the 20%% of --train's files that `tabloop train "
        "model` holds out (by a hash of each path) and learn on the rest",
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--train-positions", type=int, default=300)
    parser.add_argument("--test-positions", type=int, default=200)
    parser.add_argument("--model", default="bundled", help="completion model (see settings)")
    parser.add_argument(
        "--engine",
        choices=("auto", "ctranslate2", "torch"),
        default="auto",
        help="inference engine of the local runner (outputs are cached per engine's model id)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--context-tokens", type=int, default=512)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads (0: every core but one)"
    )
    parser.add_argument("--cache", type=Path, default=None, help="model output cache file")
    parser.add_argument(
        "--lambda",
        dest="distraction_cost",
        type=float,
        default=None,
        help="distraction cost in characters (default: the trainer's default)",
    )
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
    parser.add_argument(
        "--prompt-fix-positions",
        type=int,
        default=None,
        help="held-out positions (the first N) on which the prompt fix is measured (default: all)",
    )
    parser.add_argument(
        "--model-loop",
        metavar="BUDGET",
        default=None,
        help="also train an adapter of the model within BUDGET (e.g. 15m) on the training "
        "corpus's code and the first round's feedback, and play the held-out corpus with it",
    )
    parser.add_argument(
        "--model-loop-samples",
        type=int,
        default=None,
        help="the adapter's budget in training examples instead of time",
    )
    parser.add_argument(
        "--model-loop-data",
        choices=("code+feedback", "feedback", "code"),
        default="code+feedback",
        help="what the adapter learns from (code+feedback: as `tabloop train model` does)",
    )
    parser.add_argument(
        "--model-loop-rounds",
        type=int,
        default=0,
        help="rounds of the gate's loop on the adapted model's suggestions before it is judged",
    )
    parser.add_argument("--learning-rate", type=float, default=3e-4, help="the adapter's")
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
        engine=getattr(args, "engine", "auto"),
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
    if args.held_out_split:
        if args.test is not None:
            raise SystemExit("tabloop eval replay: --test or --held-out-split, not both")
        train_positions = sample_positions(
            args.train, args.train_positions, args.seed, keep=lambda f: not is_held_out(f)
        )
        test_positions = sample_positions(
            args.train, args.test_positions, args.seed + 1, keep=is_held_out
        )
    elif args.test is None:
        raise SystemExit("tabloop eval replay: --test DIR or --held-out-split is needed")
    else:
        train_positions = sample_positions(args.train, args.train_positions, args.seed)
        test_positions = sample_positions(args.test, args.test_positions, args.seed + 1)
    settings = engine_settings(args)
    overrides: dict[str, Any] = {
        "interval_s": args.train_interval,
        "min_events": min(200, len(train_positions)),
        "seed": args.seed,
    }
    if args.distraction_cost is not None:
        overrides["rewards"] = {"distraction_cost": args.distraction_cost}
    if args.min_ess is not None:
        overrides["min_ess"] = args.min_ess
    if args.hidden is not None:
        overrides["hidden"] = args.hidden
    trainer_settings = TrainerSettings.model_validate(overrides)
    with tempfile.TemporaryDirectory(prefix="tabloop-replay-") as tmp:
        work = Path(tmp)
        runner = load_cached_runner(args, settings.model_copy(update={"cache": True}))
        base_model_id = runner.model_id  # the model loop serves an adapter on it at the end
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
        model_loop = bool(args.model_loop or args.model_loop_samples)
        feedback = FeedbackStore(work / "feedback.sqlite") if model_loop else None
        try:
            rounds = _rounds(
                args,
                train_positions,
                runner,
                settings,
                telemetry,
                policies,
                scheduler,
                backend,
                feedback,
            )
            learned = policies.current()
            rewards = trainer_settings.rewards
            evaluation = {
                name: _evaluate(args, test_positions, runner, settings, policy, rewards)
                for name, policy in (
                    ("always_show", always_show()),
                    ("builtin", builtin_policy()),
                    ("learned", learned),
                )
            }
            # The prompt fix's effect: always-show on the same positions with the old prompt.
            fix_positions = test_positions[: args.prompt_fix_positions]
            unfixed = settings.model_copy(update={"prompt_at_line_break": False})
            before_fix = _evaluate(args, fix_positions, runner, unfixed, always_show(), rewards)
            after_fix = (
                evaluation["always_show"]
                if len(fix_positions) == len(test_positions)
                else _evaluate(args, fix_positions, runner, settings, always_show(), rewards)
            )
            # The same comparison on the positions it learned from, to show how well it carries
            # over (and to choose settings such as λ without looking at the held-out corpus).
            seen = {
                name: _evaluate(args, train_positions, runner, settings, policy, rewards)
                for name, policy in (("always_show", always_show()), ("learned", learned))
            }
            canary = _canary_drill(
                args, train_positions, runner, settings, telemetry, policies, scheduler, backend
            )
            # Every promotion the scheduler made, including those of runs between two rounds'
            # ends (a slow model makes a round outlast many trainer periods), each timed from the
            # newest event its run read to the moment the policy client first served it.
            promotions = _promotions(scheduler, policies, backend, canary.get("version"))
            loop_report = None
            if feedback is not None:
                loop = _Loop(telemetry, policies, scheduler, backend, train_positions, len(rounds))
                loop_report = _model_loop(
                    args, test_positions, runner, settings, learned, rewards, evaluation, work,
                    feedback, loop,
                )  # fmt: skip
        finally:
            policies.close()
            telemetry.shutdown(5.0)
            backend.stop()
            runner.close()
            if feedback is not None:
                feedback.close()
    delays = [p["event_to_serving_s"] for p in promotions if p["event_to_serving_s"] is not None]
    against_builtin = _changes(evaluation["builtin"], evaluation["learned"])
    summary = {
        **_changes(evaluation["always_show"], evaluation["learned"]),
        "vs_builtin": {
            k: v for k, v in against_builtin.items() if k not in ("baseline", "learned")
        },
        "learned_version": learned.version,
        "promotions": len(promotions),
        "promoted": promotions,
        # Measured for every promotion; a run that promoted nothing says so.
        "event_to_serving_s": max(delays) if delays else None,
        "event_to_serving_note": None if promotions else "no training run promoted a candidate",
        "prompt_fix": {
            "positions": len(fix_positions),
            "base_accept_rate_before": before_fix["accept_rate"],
            "base_accept_rate_after": after_fix["accept_rate"],
            "base_full_accept_rate_before": before_fix["full_accept_rate"],
            "base_full_accept_rate_after": after_fix["full_accept_rate"],
            "leading_whitespace_share_before": before_fix["leading_whitespace_share"],
            "leading_whitespace_share_after": after_fix["leading_whitespace_share"],
            "base_accepted_chars_before": before_fix["accepted_chars"],
            "base_accepted_chars_after": after_fix["accepted_chars"],
            "base_reward_before": before_fix["reward"],
            "base_reward_after": after_fix["reward"],
        },
        "canary_rollback": canary,
    }
    return {
        "command": "tabloop eval replay " + " ".join(argv),
        "corpus": {
            "train": str(args.train),
            "test": str(args.test) if args.test else f"{args.train} (held-out files)",
            "train_positions": len(train_positions),
            "test_positions": len(test_positions),
            "train_files": len({p.path for p in train_positions}),
            "test_files": len({p.path for p in test_positions}),
        },
        "model": base_model_id,
        "settings": {
            "engine": args.engine,
            "max_new_tokens": args.max_new_tokens,
            "context_tokens": args.context_tokens,
            "threads": args.threads,
            "lambda": trainer_settings.rewards.distraction_cost,
            "lambda_from_command_line": args.distraction_cost is not None,
            "canary_share": trainer_settings.canary_share,
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
        "held_out": {name: _public(figures) for name, figures in evaluation.items()},
        "held_out_before_prompt_fix": _public(before_fix),
        "training_corpus": _changes(seen["always_show"], seen["learned"]),
        "rounds": rounds,
        **({"model_loop": loop_report} if loop_report is not None else {}),
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
    feedback: FeedbackStore | None = None,
    count: int | None = None,
    first: int = 1,
) -> list[dict[str, Any]]:
    """`count` rounds (default `--rounds`) of the gate's loop on the training positions, numbered
    from `first`; the first round's shown suggestions and their outcomes go to `feedback` (each
    position once, as a user meets it once)."""
    rewards = scheduler.settings.rewards
    registry, tenant = scheduler.registry, backend.principal.tenant_id
    rounds: list[dict[str, Any]] = []
    wanted = args.rounds if count is None else count
    played = 0
    # The rounds asked for, then up to EXTRA_ROUNDS more while a canary waits for its verdict:
    # the loop ends with a version serving alone.
    while played < wanted or (
        registry.canary(tenant) is not None and played < wanted + EXTRA_ROUNDS
    ):
        number = first + played
        played += 1
        serving = policies.current()
        engine = Engine(settings, runner, policy_source=policies.current, seed=args.seed + number)
        player = Player(
            engine,
            telemetry,
            rewards,
            args.min_partial_chars,
            feedback=feedback if played == 1 else None,
        )
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
                "canary_share": serving.share if isinstance(serving, CanaryPolicy) else None,
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
        "state": summary.state,
        "canary": summary.canary,
        "pruned": summary.report.get("pruned"),
    }
    if not summary.promoted:
        return None, None, report
    while time.monotonic() < deadline:
        if policies.current().version == summary.candidate:
            return summary.candidate, round(time.time() - last_event, 2), report
        time.sleep(0.02)
    return summary.candidate, None, report


def _promotions(
    scheduler: TrainingScheduler,
    policies: PolicyClient,
    backend: LocalBackend,
    drill_version: str | None,
) -> list[dict[str, Any]]:
    """Each promoted candidate (not the canary drill's) with the delay from the newest event its
    run read to its first serving by the policy client (None if it never served there)."""
    found = []
    for run in scheduler.runs:
        if not run.promoted or run.candidate is None or run.candidate == drill_version:
            continue
        newest = event_time(backend.storage, backend.principal.tenant_id, run.through_event_id)
        served = policies.first_served.get(run.candidate)
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


def _canary_drill(
    args: argparse.Namespace,
    positions: list[Position],
    runner: CachedRunner,
    settings: CompletionSettings,
    telemetry: TelemetryClient,
    policies: PolicyClient,
    scheduler: TrainingScheduler,
    backend: LocalBackend,
) -> dict[str, Any]:
    """A bad candidate goes into canary; rounds on the training positions judge it live. Reports
    whether the scheduled trainer rolled it back on its own, and how long it took."""
    registry, tenant = scheduler.registry, backend.principal.tenant_id
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
        Player(engine, telemetry, rewards, args.min_partial_chars).play(positions)
        played += len(positions)
        deliver(telemetry)
        newest = latest_event_id(backend.storage, tenant)
        _await_training(scheduler, policies, newest, time.time(), args)
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


@dataclass
class _Loop:
    """What the gate's loop runs on, for the rounds after the adapter serves."""

    telemetry: TelemetryClient
    policies: PolicyClient
    scheduler: TrainingScheduler
    backend: LocalBackend
    positions: list[Position]
    rounds_before: int


def _model_loop(
    args: argparse.Namespace,
    positions: list[Position],
    runner: CachedRunner,
    settings: CompletionSettings,
    learned: Policy,
    rewards: RewardSettings,
    base: dict[str, dict[str, Any]],
    work: Path,
    feedback: FeedbackStore,
    loop: _Loop,
) -> dict[str, Any]:
    """Train an adapter as `tabloop train model` does, serve it, and play the held-out corpus
    with it: shown always, through the gate learned on the base model's suggestions, and (with
    `--model-loop-rounds`) through the gate after more rounds on the adapted model's."""
    from training.trainer import Budget, Progress, TrainSettings, parse_duration
    from training.workspace import train_workspace

    def progress(p: Progress) -> None:
        print(
            f"\rmodel loop: step {p.step} samples {p.samples} loss {p.loss:.3f} "
            f"{p.samples_per_s:.2f} samples/s",
            end="",
            file=sys.stderr,
            flush=True,
        )

    data = args.model_loop_data
    budget = Budget(
        samples=args.model_loop_samples,
        seconds=parse_duration(args.model_loop) if args.model_loop else None,
    )
    train_settings = TrainSettings(seed=args.seed, learning_rate=args.learning_rate)
    rows = feedback.count()
    outcomes = feedback.outcome_counts()
    result, held_out_files = train_workspace(
        args.train,
        model=settings.model,
        cache_dir=configured_cache_dir(),
        work_dir=work / "adapter",
        budget=budget,
        settings=train_settings,
        feedback=feedback if "feedback" in data else None,
        code="code" in data,
        on_progress=progress,
    )
    print(file=sys.stderr)
    swap_started = time.perf_counter()
    runner.swap_adapter(Path(result.adapter))
    ready_s = time.perf_counter() - swap_started
    policies: list[tuple[str, Policy]] = [("always_show", always_show()), ("learned", learned)]
    rounds: list[dict[str, Any]] = []
    if args.model_loop_rounds:
        rounds = _rounds(
            args,
            loop.positions,
            runner,
            settings,
            loop.telemetry,
            loop.policies,
            loop.scheduler,
            loop.backend,
            count=args.model_loop_rounds,
            first=loop.rounds_before + 1,
        )
        policies.append(("relearned", loop.policies.current()))
    adapted = {
        name: _evaluate(args, positions, runner, settings, policy, rewards)
        for name, policy in policies
    }
    relearned = (
        {
            "relearned_vs_base_always_show": _changes(base["always_show"], adapted["relearned"]),
            "relearned_vs_base_learned": _changes(base["learned"], adapted["relearned"]),
        }
        if "relearned" in adapted
        else {}
    )
    return {
        "data": data,
        "feedback_rows": rows,
        "feedback_outcomes": outcomes,
        "training": {
            "budget": args.model_loop,
            "budget_samples": args.model_loop_samples,
            "learning_rate": args.learning_rate,
            "steps": result.steps,
            "samples": result.samples,
            "elapsed_s": result.elapsed_s,
            "samples_per_s": result.samples_per_s,
            "final_loss": result.loss,
            "peak_rss_mb": result.peak_rss_mb,
            "code_files_kept_out": len(held_out_files),
        },
        "model": runner.model_id,
        "adapter_ready_s": round(ready_s, 2),
        "held_out": {name: _public(figures) for name, figures in adapted.items()},
        # Against always-show with the base model (the goal's baseline), and against the gate
        # alone (the learned gate on the base model).
        "summary": {
            "adapted_learned_vs_base_always_show": _changes(
                base["always_show"], adapted["learned"]
            ),
            "adapted_always_show_vs_base_always_show": _changes(
                base["always_show"], adapted["always_show"]
            ),
            "adapted_learned_vs_base_learned": _changes(base["learned"], adapted["learned"]),
            **relearned,
        },
        "rounds": rounds,
    }


def _evaluate(
    args: argparse.Namespace,
    positions: list[Position],
    runner: CachedRunner,
    settings: CompletionSettings,
    policy: Policy,
    rewards: RewardSettings,
) -> dict[str, Any]:
    tally = Tally()
    per_position = [0.0] * len(positions)
    for draw in range(args.eval_draws):
        engine = Engine(settings, runner, policy_source=lambda: policy, seed=10_000 + draw)
        player = Player(engine, None, rewards, args.min_partial_chars)
        player.log = []
        played = player.play(positions)
        for i, (decision, response) in enumerate(player.log):
            if response is not None:
                per_position[i] += reward_of(response, len(decision.text), rewards)
        for key, value in asdict(played).items():
            setattr(tally, key, getattr(tally, key) + value)
    figures = tally.report(args.eval_draws)
    return {
        "version": policy.version,
        **{k: round(v, 4) for k, v in figures.items()},
        "position_rewards": [r / args.eval_draws for r in per_position],
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
