"""Which objective learns most from accepted and rejected suggestions, on the same data?

The objectives a workspace's run can train with (`docs/learning.md`), each from a fresh LoRA with
the same seed and the same number of examples, on the same feedback:

- `fim`: the loop's default: supervised fill-in-the-middle on the training files' code, and the
  policy-gradient term on the feedback rows (accepted pulled up, ignored pushed down);
- `fim_kl`: the same with the KL anchor to the weights the run started from (`--kl-weight`);
- `feedback`: the default objective on the feedback rows alone (the data KTO sees);
- `feedback_kl`: the same with the KL anchor;
- `kto`: trl's `KTOTrainer` on the feedback rows (desirable: a positive advantage), the base model
  as its reference.

The feedback is made as the loop makes it: the base model completes `--positions` typing pauses in
the corpus's training files on the default engine, shown always, and the simulated user accepts,
partly accepts or ignores each suggestion (`evaluation.simulation`); the rows go to a workspace's
feedback store through the server's own recorder. The judgement is the loop's own
(`training.evaluate.compare`, against the base model on the same cursors, paired 95% intervals):
`--n` cursors cut in the held-out files (exact-line match, edit similarity); the text the user kept
at `--judge-positions` pauses in the held-out files, played the same way (`kept_text`); and how
often each model writes an ignored suggestion's first line again there (`ignored_reproduced`,
lower is better). No judged row or file was trained on.

    tabloop bench objectives [--corpus email] [--positions 240] [--judge-positions 120]
        [--samples 96] [--configs fim,fim_kl,feedback,kto] [--kl-weight 0.1] [--n 60]
        [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from common.machine import cpu_description
from common.paths import resolve_cache_dir
from evaluation.bench.adapters import corpus_root

# Each configuration: the `TrainSettings` it changes, and whether the code trains too.
CONFIGS: dict[str, tuple[dict[str, Any], bool]] = {
    "fim": ({}, True),
    "fim_kl": ({"kl_weight": None}, True),  # None: `--kl-weight`
    "feedback": ({}, False),
    "feedback_kl": ({"kl_weight": None}, False),
    "kto": ({"objective": "kto"}, False),
}
DEFAULT_CONFIGS = "fim,fim_kl,feedback,kto"


def _play(
    runner: Any, settings: Any, positions: list[Any], store: Any, seed: int
) -> dict[str, float]:
    """The base model at `positions`, shown always; the simulated user's outcomes go to `store`
    as the server keeps them. The tally's figures."""
    from backend.policy.settings import RewardSettings
    from completion.engine import Engine
    from evaluation.replay.player import Player, always_show

    policy = always_show()
    engine = Engine(settings, runner, policy_source=lambda: policy, seed=seed)
    player = Player(engine, None, RewardSettings(), min_partial_chars=4, feedback=store)
    return {k: round(v, 4) for k, v in player.play(positions).report().items()}


def _judgement(report: dict[str, Any]) -> dict[str, Any]:
    """The figures of `compare`'s report the comparison reads (the engine's timing left out)."""
    keep = ("n", "serving", "candidate", "exact_line_difference", "edit_similarity_difference")
    judged: dict[str, Any] = {"files": {k: report[k] for k in keep}}
    for part in ("kept_text", "ignored_reproduced"):
        if part in report:
            judged[part] = report[part]
    return judged


def train_config(
    name: str, root: Path, args: argparse.Namespace, cache_dir: Path, work: Path, feedback: Any
) -> tuple[Any, dict[str, Any]]:
    """Configuration `name`'s adapter, trained fresh in `work / name`; (result, its report)."""
    import torch

    from training.budget import Budget
    from training.trainer import TrainSettings
    from training.workspace import train_workspace

    changes, code = CONFIGS[name]
    changes = {k: args.kl_weight if v is None else v for k, v in changes.items()}
    settings = TrainSettings(
        seed=args.seed,
        effective_batch=args.effective_batch,
        max_prompt_tokens=args.context_tokens,
        checkpoint_every=10_000,
        **changes,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        result, _ = train_workspace(
            root,
            model=args.model,
            cache_dir=cache_dir,
            work_dir=work / name,
            budget=Budget(samples=args.samples),
            settings=settings,
            feedback=feedback,
            code=code,
        )
    finally:
        torch.set_num_threads(threads)
    print(f"{name}: {result.samples} examples, loss {result.loss:.3f}", file=sys.stderr)
    training = {
        "changes": changes,
        "code": code,
        "samples": result.samples,
        "steps": result.steps,
        "elapsed_s": result.elapsed_s,
        "samples_per_s": result.samples_per_s,
        "final_loss": result.loss,
        "peak_rss_mb": result.peak_rss_mb,
        "window": result.window,
        "base_dtype": settings.base_dtype,
        "autocast": settings.autocast,
        "objective": settings.objective,
        "kl_weight": settings.kl_weight,
        "kl_reference": settings.kl_reference,
    }
    return result, training


def run(args: argparse.Namespace, cache_dir: Path) -> dict[str, Any]:
    from completion.settings import CompletionSettings
    from evaluation.simulation import sample_positions
    from training.evaluate import compare, held_out_cursors, held_out_outcomes, judging_runner
    from training.examples import split_files, workspace_files
    from training.feedback import FeedbackStore

    names = args.configs.split(",")
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise SystemExit(f"tabloop bench objectives: unknown configs {unknown}: {list(CONFIGS)}")
    root = corpus_root(args.corpus)
    work = cache_dir / "bench" / "objectives" / f"{root.name}-{args.seed}"
    shutil.rmtree(work, ignore_errors=True)  # fresh stores, fresh adapters
    work.mkdir(parents=True)
    train_files, held_out = split_files(workspace_files(root))
    completion = CompletionSettings(
        model=args.model,
        engine=args.engine,
        max_new_tokens=args.max_new_tokens,
        context_tokens=args.context_tokens,
        threads=args.threads,
        cache=False,  # every position asks the model
        context_timeout_ms=60_000,
    )
    runner = judging_runner(completion, cache_dir)
    feedback = FeedbackStore(work / "feedback.sqlite", workspace=root)
    judged = FeedbackStore(work / "judged.sqlite", workspace=root)
    report: dict[str, Any] = {"corpus": str(root), "held_out_files": held_out}
    try:
        report["model_id"] = runner.model_id
        in_training, in_held_out = set(train_files), set(held_out)
        report["played"] = {
            "training": _play(
                runner,
                completion,
                sample_positions(root, args.positions, args.seed, in_training.__contains__),
                feedback,
                args.seed,
            ),
            "judging": _play(
                runner,
                completion,
                sample_positions(root, args.judge_positions, args.seed, in_held_out.__contains__),
                judged,
                args.seed,
            ),
        }
        report["feedback"] = {
            "training": feedback.outcome_counts(),
            "judging": judged.outcome_counts(),
        }
        # Every judged row is unseen: no training record, no mark.
        outcomes = held_out_outcomes(judged, {"window": {}}, limit=args.judge_positions)
        cursors = held_out_cursors(root, held_out, args.n, seed=args.seed)
        configs: dict[str, Any] = {}
        for name in names:
            try:
                result, training = train_config(name, root, args, cache_dir, work, feedback)
            except ValueError as exc:  # e.g. KTO without both labels: the others still run
                configs[name] = {"error": str(exc)}
                continue
            compared = compare(runner, completion, None, Path(result.adapter), cursors, outcomes)
            configs[name] = {"training": training, "judgement": _judgement(compared)}
        report["configs"] = configs
    finally:
        runner.close()
        feedback.close()
        judged.close()
    return report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tabloop bench objectives", description=__doc__)
    parser.add_argument(
        "--corpus", default="email", help="a standard-library package, installed package or dir"
    )
    parser.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"of {', '.join(CONFIGS)}")
    parser.add_argument("--positions", type=int, default=240, help="pauses played for feedback")
    parser.add_argument(
        "--judge-positions", type=int, default=120, help="pauses played in held-out files"
    )
    parser.add_argument("--samples", type=int, default=96, help="examples each run trains on")
    parser.add_argument("--kl-weight", type=float, default=0.1, help="the anchor's weight (λ)")
    parser.add_argument("--n", type=int, default=60, help="cursors cut in the held-out files")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="bundled")
    parser.add_argument(
        "--engine", default="auto", help="completing and judging (auto: the default engine)"
    )
    parser.add_argument("--context-tokens", type=int, default=384)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--effective-batch", type=int, default=8, help="examples per step")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads, every stage")
    parser.add_argument("--cache-dir", default="")
    parser.add_argument("--json", action="store_true", help="print JSON (the only output form)")
    args = parser.parse_args(argv)
    cache_dir = resolve_cache_dir(args.cache_dir or None)
    started = time.perf_counter()
    corpus = run(args, cache_dir)
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "cache_dir")}
    report = {
        "benchmark": "objectives",
        "command": "tabloop bench objectives " + " ".join(argv),
        "machine": {"cpus": os.cpu_count()},
        "cpu": cpu_description(),
        "settings": settings,
        **corpus,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(report, indent=2, default=_plain))
    return 0


def _plain(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    return str(value)
