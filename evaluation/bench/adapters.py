"""Repository adaptation: does a LoRA adapter trained on a code base's files complete its other
files better than the base model?

For each corpus (packages of the standard library by default, installed packages or any directory;
not this project's code), the adapter trains on the files outside the held-out 20% (the same hash
split `tabloop train model` uses) within a fixed wall-clock budget on this machine; then the holes
of `tabloop eval holes` (same sampler, same scoring) are cut in the held-out files and completed by
the base model and by the base model with the adapter, on the same holes in the same run:
exact-line match, edit similarity, parse rate. Training cost is reported too: samples/s, seconds
per 1,000 examples and the largest resident memory while training, and what serving the new adapter
took (`adapter_ready_s`: on the fast engine, the default, merging it into the base weights and
converting the result; on torch, applying it).

    tabloop bench adapters [--corpora email,xml] [--budget 8m] [--n 60] [--engine E]
                           [--precision auto|float32|bfloat16] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import shutil
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from common.machine import cpu_description
from common.paths import resolve_cache_dir
from evaluation.holes import Hole, sample_holes, score


def _rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def _exact(holes: list[Hole], suggestions: list[str]) -> list[bool]:
    return [
        s.split("\n", 1)[0].strip() == h.truth.split("\n", 1)[0].strip()
        for h, s in zip(holes, suggestions, strict=True)
    ]


def paired_difference(base: list[bool], adapted: list[bool]) -> dict[str, float]:
    """Mean of adapted - base per hole, with a normal 95% interval of the paired difference."""
    diffs = [int(a) - int(b) for a, b in zip(adapted, base, strict=True)]
    n = len(diffs)
    mean = sum(diffs) / n
    var = sum((d - mean) ** 2 for d in diffs) / max(n - 1, 1)
    half = 1.96 * math.sqrt(var / n)
    return {
        "mean": round(mean, 4),
        "ci95_low": round(mean - half, 4),
        "ci95_high": round(mean + half, 4),
    }


# `--precision`: the training settings it stands for (auto: `TrainSettings`' own choice).
PRECISIONS: dict[str, dict[str, Any]] = {
    "auto": {},
    "float32": {"base_dtype": "float32", "autocast": False},
    "bfloat16": {"base_dtype": "bfloat16", "autocast": True},
}


def _complete(
    runner: Any, settings: Any, holes: list[Hole], label: str
) -> tuple[list[str], list[float]]:
    from completion.engine import Engine

    engine = Engine(settings, runner)
    suggestions, latencies = [], []
    for number, hole in enumerate(holes, 1):
        decision = engine.complete(hole.request())
        suggestions.append(decision.text)
        if decision.generation is not None:
            g = decision.generation
            latencies.append(decision.timings.context_ms + g.prefill_ms + g.decode_ms)
        print(f"\r{label}: {number}/{len(holes)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return suggestions, latencies


def run_corpus(root: Path, args: argparse.Namespace, cache_dir: Path) -> dict[str, Any]:
    from completion.runners.torch_runner import TorchRunner
    from completion.settings import CompletionSettings
    from training.budget import Budget, parse_duration
    from training.trainer import Progress, TrainSettings
    from training.workspace import train_workspace

    work = cache_dir / "bench" / "adapters" / f"{root.name}-{args.seed}"
    shutil.rmtree(work, ignore_errors=True)  # a fresh run: no checkpoint to resume
    settings = TrainSettings(
        seed=args.seed,
        learning_rate=args.learning_rate,
        effective_batch=args.effective_batch,
        max_prompt_tokens=args.context_tokens,
        checkpoint_every=10_000,
        **PRECISIONS[args.precision],
    )
    import torch

    serving_threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)  # the loop trains on `training.threads` (1)
    training_threads = torch.get_num_threads()
    rss = [_rss_mb()]

    def progress(p: Progress) -> None:
        rss.append(_rss_mb())
        print(
            f"\rtrain {root.name}: step {p.step} samples {p.samples} loss {p.loss:.3f} "
            f"{p.samples_per_s:.2f} samples/s",
            end="",
            file=sys.stderr,
            flush=True,
        )

    try:
        result, held_out = train_workspace(
            root,
            model=args.model,
            cache_dir=cache_dir,
            work_dir=work,
            budget=Budget(seconds=parse_duration(args.budget)),
            settings=settings,
            on_progress=progress,
        )
    finally:
        torch.set_num_threads(serving_threads)
    print(file=sys.stderr)
    training = {
        "budget": args.budget,
        "steps": result.steps,
        "samples": result.samples,
        "tokens": result.tokens,
        "elapsed_s": result.elapsed_s,
        "samples_per_s": result.samples_per_s,
        "seconds_per_1000_examples": result.seconds_per_1000_examples,
        "final_loss": result.loss,
        "micro_batch": result.micro_batch,
        "accumulation": result.accumulation,
        "device": result.device,
        "threads": training_threads,
        "max_rss_mb_while_training": round(max(rss), 1),
        # The precision the run used (`--precision auto` follows the CPU).
        "base_dtype": settings.base_dtype,
        "autocast": settings.autocast,
    }
    report: dict[str, Any] = {
        "corpus": str(root),
        "held_out_files": held_out,
        "training": training,
    }
    gc.collect()  # the training model's memory goes before the serving one loads
    holes = sample_holes([root / f for f in held_out], args.n, random.Random(args.seed))
    completion = CompletionSettings(
        model=args.model,
        max_new_tokens=args.max_new_tokens,
        context_tokens=args.context_tokens,
        context_timeout_ms=60_000,
    )
    runner: Any
    if args.engine == "ctranslate2":
        from completion.runners.ct2 import Ct2Runner

        runner = Ct2Runner(args.model, cache_dir)
    else:
        runner = TorchRunner(args.model, cache_dir, reuse_cache=True)
    try:
        base_text, base_ms = _complete(runner, completion, holes, f"{root.name} base")
        swap_started = time.perf_counter()
        runner.swap_adapter(Path(result.adapter))  # the fast engine merges and converts first
        report["serving"] = {
            "engine": args.engine,
            "model_id": runner.model_id,
            "adapter_ready_s": round(time.perf_counter() - swap_started, 2),
        }
        adapted_text, adapted_ms = _complete(runner, completion, holes, f"{root.name} adapted")
    finally:
        runner.close()
    if args.n == 0:  # the cost of training and of serving the adapter only
        return report
    base = score(holes, base_text, base_ms)
    adapted = score(holes, adapted_text, adapted_ms)
    report.update(
        base=base,
        adapted=adapted,
        exact_line_match_relative_gain=round(
            adapted["exact_line_match"] / base["exact_line_match"] - 1, 4
        )
        if base["exact_line_match"]
        else None,
        exact_line_match_paired_difference=paired_difference(
            _exact(holes, base_text), _exact(holes, adapted_text)
        ),
    )
    return report


def corpus_root(name: str) -> Path:
    """The directory of corpus `name`: a path, a package of the standard library, or an
    installed package (its sources as installed)."""
    import importlib.util

    given = Path(name).expanduser()
    if given.is_dir():
        return given.resolve()
    stdlib = Path(sysconfig.get_paths()["stdlib"]) / name
    if stdlib.is_dir():
        return stdlib
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise SystemExit(f"tabloop bench adapters: no package or directory {name!r}")
    return Path(locations[0])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tabloop bench adapters", description=__doc__)
    parser.add_argument(
        "--corpora",
        default="email,xml",
        help="packages of the standard library, installed packages or directories",
    )
    parser.add_argument("--budget", default="8m", help="training wall-clock per corpus")
    parser.add_argument("--n", type=int, default=60, help="holes per corpus; 0: the cost only")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="bundled")
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--context-tokens", type=int, default=384)
    parser.add_argument("--effective-batch", type=int, default=8, help="examples per step")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--engine",
        choices=("ctranslate2", "torch"),
        default="ctranslate2",
        help="engine completing the holes (the fast one merges and converts the adapter first)",
    )
    parser.add_argument(
        "--precision",
        choices=tuple(PRECISIONS),
        default="auto",
        help="training's precision: auto (the default: bfloat16 where the CPU computes it "
        "natively), float32, or bfloat16 (a bfloat16 base with autocast)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="CPU threads training uses (0: torch's default, every core; the background loop "
        "trains on `training.threads`, 1 by default)",
    )
    parser.add_argument("--cache-dir", default="")
    parser.add_argument("--json", action="store_true", help="print JSON (the only output form)")
    args = parser.parse_args(argv)
    cache_dir = resolve_cache_dir(args.cache_dir or None)
    roots = [corpus_root(name) for name in args.corpora.split(",")]
    started = time.perf_counter()
    corpora = [run_corpus(root, args, cache_dir) for root in roots]
    report = {
        "benchmark": "adapters",
        "command": "tabloop bench adapters " + " ".join(argv),
        "machine": {"cpus": os.cpu_count()},
        "cpu": cpu_description(),
        "settings": {
            "budget_per_corpus": args.budget,
            "n": args.n,
            "seed": args.seed,
            "model": args.model,
            "learning_rate": args.learning_rate,
            "context_tokens": args.context_tokens,
            "effective_batch": args.effective_batch,
            "max_new_tokens": args.max_new_tokens,
            "engine": args.engine,
            "precision": args.precision,
            "threads": args.threads,
        },
        "corpora": corpora,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(report, indent=2))
    return 0
