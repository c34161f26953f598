"""`--model-loop`: the model learns too, as on a user's machine, and the held-out corpus is played
again with the adapted model."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from backend.policy.settings import RewardSettings
from common.config import configured_cache_dir
from completion.gate import Policy
from completion.output_cache import CachedRunner
from completion.settings import CompletionSettings
from evaluation.replay.player import always_show, changes, evaluate_policy, public
from evaluation.replay.rounds import Loop, play_rounds
from evaluation.simulation import Position
from training.feedback import FeedbackStore


def model_loop(
    args: argparse.Namespace,
    loop: Loop,
    runner: CachedRunner,
    settings: CompletionSettings,
    *,
    positions: list[Position],
    train_positions: list[Position],
    rounds_before: int,
    learned: Policy,
    rewards: RewardSettings,
    base: dict[str, dict[str, Any]],
    feedback: FeedbackStore,
    work: Path,
) -> dict[str, Any]:
    """Train an adapter as `tabloop train model` does, serve it, and play the held-out corpus
    (`positions`) with it: shown always, through the gate learned on the base model's
    suggestions, and (with `--model-loop-rounds`) through the gate after more rounds on the
    adapted model's (on `train_positions`, numbered after the `rounds_before` played)."""
    from training.budget import Budget, parse_duration
    from training.trainer import Progress, TrainSettings
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
        rounds = play_rounds(
            args,
            loop,
            train_positions,
            runner,
            settings,
            count=args.model_loop_rounds,
            first=rounds_before + 1,
        )
        policies.append(("relearned", loop.policies.current()))
    adapted = {
        name: evaluate_policy(args, positions, runner, settings, policy, rewards)
        for name, policy in policies
    }
    relearned = (
        {
            "relearned_vs_base_always_show": changes(base["always_show"], adapted["relearned"]),
            "relearned_vs_base_learned": changes(base["learned"], adapted["relearned"]),
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
        "held_out": {name: public(figures) for name, figures in adapted.items()},
        # Against always-show with the base model (the goal's baseline), and against the gate
        # alone (the learned gate on the base model).
        "summary": {
            "adapted_learned_vs_base_always_show": changes(base["always_show"], adapted["learned"]),
            "adapted_always_show_vs_base_always_show": changes(
                base["always_show"], adapted["always_show"]
            ),
            "adapted_learned_vs_base_learned": changes(base["learned"], adapted["learned"]),
            **relearned,
        },
        "rounds": rounds,
    }
