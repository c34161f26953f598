"""Playing positions: the engine suggests, the gate decides, the simulated user reacts.

`Player` plays positions through the engine and the simulated user, the user's session going
through the server's own code (`evaluation.editing.EditingSession`); `Tally` sums what users saw
and kept; `evaluate_policy` plays the held-out corpus with one policy, and `changes` compares two
such plays on the same positions.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import asdict, dataclass
from typing import Any

from backend.policy.rewards import outcome_reward
from backend.policy.settings import RewardSettings
from common.config import configured_cache_dir
from completion.engine import Engine
from completion.gate import Policy, builtin_policy
from completion.output_cache import CachedRunner
from completion.settings import CompletionSettings
from completion.types import Decision
from evaluation.editing import EditingSession
from evaluation.simulation import Position, UserResponse, simulated_user
from telemetry.client import TelemetryClient
from telemetry.events import OutcomeEvent
from training.feedback import FeedbackRecorder, FeedbackStore


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
        self.model_version: str | None = None  # the adapter version serving, on feedback rows
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
                self.recorder.shown(decision, request, self.model_version)
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


def evaluate_policy(
    args: argparse.Namespace,
    positions: list[Position],
    runner: CachedRunner,
    settings: CompletionSettings,
    policy: Policy,
    rewards: RewardSettings,
) -> dict[str, Any]:
    """`policy` played `--eval-draws` times on `positions` (nothing reported, nothing learned):
    per-draw figures, and each position's mean reward for `changes`."""
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


def _change_pct(new: float, old: float) -> float | None:
    return round(100.0 * (new - old) / old, 2) if old else None


def changes(base: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
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
        "baseline": public(base),
        "learned": public(new),
        **{f"{name}_change_pct": _change_pct(new[name], base[name]) for name in figures},
        "reward_change": round(new["reward"] - base["reward"], 3),
        "reward_gain_stderr": round(stderr, 3),
        "reward_gain_lower_bound": round(gain - 1.64 * stderr, 3),
    }


def public(figures: dict[str, Any]) -> dict[str, Any]:
    """A play's figures as reported (without the per-position rewards)."""
    return {k: v for k, v in figures.items() if k != "position_rewards"}
