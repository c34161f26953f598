"""`tabloop eval replay`: the command line, and the replay's run from the corpora to the report."""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from backend.policy.settings import TrainerSettings
from common.signals import sigterm_as_exit
from completion.gate import builtin_policy
from evaluation.replay.continuous import run_continuous
from evaluation.replay.drills import canary_drill
from evaluation.replay.model_loop import model_loop
from evaluation.replay.player import (
    always_show,
    changes,
    engine_settings,
    evaluate_policy,
    load_cached_runner,
    public,
)
from evaluation.replay.rounds import open_loop, play_rounds, promotions
from evaluation.simulation import Position, sample_positions
from training.examples import is_held_out
from training.feedback import FeedbackStore


def build_parser() -> argparse.ArgumentParser:
    """The command line of `tabloop eval replay`."""
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
    parser.add_argument(
        "--continuous",
        action="store_true",
        help="the loop over time: --train is revealed in --rounds parts, a round types in the "
        "newest part, and the model trains between rounds as the language server does by itself "
        "(see evaluation.replay.continuous); --test and the held-out plays are not used",
    )
    parser.add_argument(
        "--round-positions", type=int, default=100, help="--continuous: positions per round"
    )
    parser.add_argument(
        "--sessions-per-round",
        type=int,
        default=4,
        help="--continuous: language server sessions a round is typed in (each on its canary arm)",
    )
    parser.add_argument(
        "--loop-setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="--continuous: change one of the training loop's settings (the `training` section)",
    )
    parser.add_argument("--learning-rate", type=float, default=3e-4, help="the adapter's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    return parser


def main(argv: list[str]) -> int:
    """Entry point of `tabloop eval replay`."""
    args = build_parser().parse_args(argv)
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


def _positions(args: argparse.Namespace) -> tuple[list[Position], list[Position]]:
    """The training and the held-out positions the command line asks for."""
    if args.held_out_split:
        if args.test is not None:
            raise SystemExit("tabloop eval replay: --test or --held-out-split, not both")
        train = sample_positions(
            args.train, args.train_positions, args.seed, keep=lambda f: not is_held_out(f)
        )
        test = sample_positions(args.train, args.test_positions, args.seed + 1, keep=is_held_out)
        return train, test
    if args.test is None:
        raise SystemExit("tabloop eval replay: --test DIR or --held-out-split is needed")
    train = sample_positions(args.train, args.train_positions, args.seed)
    return train, sample_positions(args.test, args.test_positions, args.seed + 1)


def _trainer_settings(args: argparse.Namespace, train_positions: int) -> TrainerSettings:
    """The scheduled trainer's settings: its period and the command line's overrides."""
    overrides: dict[str, Any] = {
        "interval_s": args.train_interval,
        "min_events": min(200, train_positions),
        "seed": args.seed,
    }
    if args.distraction_cost is not None:
        overrides["rewards"] = {"distraction_cost": args.distraction_cost}
    if args.min_ess is not None:
        overrides["min_ess"] = args.min_ess
    if args.hidden is not None:
        overrides["hidden"] = args.hidden
    return TrainerSettings.model_validate(overrides)


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """The replay; returns its report."""
    if args.continuous:
        return _run_continuous(args, argv)
    started = time.time()
    train_positions, test_positions = _positions(args)
    settings = engine_settings(args)
    trainer_settings = _trainer_settings(args, len(train_positions))
    rewards = trainer_settings.rewards
    # Stopped with SIGTERM, the replay still stops its training child and removes its files.
    with (
        sigterm_as_exit(),
        tempfile.TemporaryDirectory(prefix="tabloop-replay-") as tmp,
        ExitStack() as stack,
    ):
        work = Path(tmp)
        runner = load_cached_runner(args, settings.model_copy(update={"cache": True}))
        stack.callback(runner.close)
        base_model_id = runner.model_id  # the model loop serves an adapter on it at the end
        loop = stack.enter_context(open_loop(work, trainer_settings, args.refresh))
        feedback = None
        if args.model_loop or args.model_loop_samples:
            feedback = FeedbackStore(work / "feedback.sqlite")
            stack.callback(feedback.close)
        rounds = play_rounds(args, loop, train_positions, runner, settings, feedback)
        learned = loop.policies.current()
        evaluation = {
            name: evaluate_policy(args, test_positions, runner, settings, policy, rewards)
            for name, policy in (
                ("always_show", always_show()),
                ("builtin", builtin_policy()),
                ("learned", learned),
            )
        }
        # The prompt fix's effect: always-show on the same positions with the old prompt.
        fix_positions = test_positions[: args.prompt_fix_positions]
        unfixed = settings.model_copy(update={"prompt_at_line_break": False})
        before_fix = evaluate_policy(args, fix_positions, runner, unfixed, always_show(), rewards)
        after_fix = (
            evaluation["always_show"]
            if len(fix_positions) == len(test_positions)
            else evaluate_policy(args, fix_positions, runner, settings, always_show(), rewards)
        )
        # The same comparison on the positions it learned from, to show how well it carries
        # over (and to choose settings such as λ without looking at the held-out corpus).
        seen = {
            name: evaluate_policy(args, train_positions, runner, settings, policy, rewards)
            for name, policy in (("always_show", always_show()), ("learned", learned))
        }
        canary = canary_drill(args, loop, train_positions, runner, settings)
        # Every promotion the scheduler made, including those of runs between two rounds'
        # ends (a slow model makes a round outlast many trainer periods), each timed from the
        # newest event its run read to the moment the policy client first served it.
        promoted = promotions(loop, canary.get("version"))
        loop_report = None
        if feedback is not None:
            loop_report = model_loop(
                args,
                loop,
                runner,
                settings,
                positions=test_positions,
                train_positions=train_positions,
                rounds_before=len(rounds),
                learned=learned,
                rewards=rewards,
                base=evaluation,
                feedback=feedback,
                work=work,
            )
    summary = {
        **_summary(evaluation, learned.version, promoted),
        "prompt_fix": _prompt_fix(len(fix_positions), before_fix, after_fix),
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
        "held_out": {name: public(figures) for name, figures in evaluation.items()},
        "held_out_before_prompt_fix": public(before_fix),
        "training_corpus": changes(seen["always_show"], seen["learned"]),
        "rounds": rounds,
        **({"model_loop": loop_report} if loop_report is not None else {}),
        "wall_s": round(time.time() - started, 1),
    }


def _run_continuous(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """`--continuous`: the loop over time (`evaluation.replay.continuous`)."""
    settings = engine_settings(args)
    # The gate's trainer wants a round's events before it runs (as `_trainer_settings` does).
    trainer_settings = _trainer_settings(args, args.round_positions)
    # Stopped with SIGTERM, it still stops the run it waits for and removes its files.
    with (
        sigterm_as_exit(),
        tempfile.TemporaryDirectory(prefix="tabloop-replay-") as tmp,
        ExitStack() as stack,
    ):
        work = Path(tmp)
        runner = load_cached_runner(args, settings.model_copy(update={"cache": True}))
        stack.callback(runner.close)
        loop = stack.enter_context(open_loop(work, trainer_settings, args.refresh))
        return run_continuous(args, argv, loop, runner, settings, work)


def _summary(
    evaluation: dict[str, dict[str, Any]], learned: str, promoted: list[dict[str, Any]]
) -> dict[str, Any]:
    """The learned policy against always-show and the built-in policy, and its promotions."""
    delays = [p["event_to_serving_s"] for p in promoted if p["event_to_serving_s"] is not None]
    against_builtin = changes(evaluation["builtin"], evaluation["learned"])
    return {
        **changes(evaluation["always_show"], evaluation["learned"]),
        "vs_builtin": {
            k: v for k, v in against_builtin.items() if k not in ("baseline", "learned")
        },
        "learned_version": learned,
        "promotions": len(promoted),
        "promoted": promoted,
        # Measured for every promotion; a run that promoted nothing says so.
        "event_to_serving_s": max(delays) if delays else None,
        "event_to_serving_note": None if promoted else "no training run promoted a candidate",
    }


def _prompt_fix(positions: int, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Always-show's figures with the old prompt (`before`) and the current one (`after`)."""
    return {
        "positions": positions,
        "base_accept_rate_before": before["accept_rate"],
        "base_accept_rate_after": after["accept_rate"],
        "base_full_accept_rate_before": before["full_accept_rate"],
        "base_full_accept_rate_after": after["full_accept_rate"],
        "leading_whitespace_share_before": before["leading_whitespace_share"],
        "leading_whitespace_share_after": after["leading_whitespace_share"],
        "base_accepted_chars_before": before["accepted_chars"],
        "base_accepted_chars_after": after["accepted_chars"],
        "base_reward_before": before["reward"],
        "base_reward_after": after["reward"],
    }
