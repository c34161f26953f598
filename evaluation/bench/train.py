"""What a training step costs: the trainer as first built against its cheaper settings, in one run.

Each configuration trains a fresh LoRA adapter in a process of its own (peak resident memory
never goes down, so two configurations in one process would hide the second's) on the same
fill-in-the-middle examples (the training files of a standard-library package, the same seed),
with the same thread count and the same sample budget, sizing its micro-batch from free memory
as `tabloop train model` does. Reported per configuration: samples/s and tokens/s over the whole
run and after the first optimiser step (which pays for allocating every buffer), samples per
CPU-second (all threads; less sensitive than wall-clock rates to other work on the machine, more
to threads spinning while they wait), the process's peak resident memory (loading included), the
micro-batch chosen, the final loss and the settings. The peak is also given for loading the
model alone and for training alone (the peak is reset in between, where Linux allows it): loading
maps the model's file, whose pages count as resident while it is read. `today` is the trainer as
first built (float32 base, no autocast, logits for the batch's last positions, no activation
checkpointing, LoRA dropout 0.05, the micro-batch sized from free memory on a CPU too); `default`
is `TrainSettings()` (a bfloat16 base and autocast where the CPU computes bfloat16 natively,
float32 elsewhere; the head at the middle's positions; activation checkpointing of every second
decoder layer; no LoRA dropout); `before` the defaults as they were until checkpointing went on
and the dropout off; `no_checkpointing` and `dropout` the defaults with one of those two undone,
`all_layers` with every layer checkpointed, `unbounded_cache` with oneDNN's primitive cache at
its own default (1024, as `today` and `before` have it; the trainer keeps 64); `float32` the
defaults in float32 whatever the CPU; `kl` adds the KL anchor. `--micro-batch N` fixes the
micro-batch of every configuration (0: as the trainer sizes it). The default 64 examples reach
full-length ones (`email`'s first 16 average 346 tokens; a run's peak at 16 examples was 1.2 GB
below its peak at 64).

    tabloop bench train [--samples 64] [--configs today,default,before] [--threads 2]
                        [--corpus email] [--model bundled] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from common.machine import cpu_description
from common.memory import PRIMITIVE_CACHE_ENV

BASELINE = "today"
# Each configuration is the defaults with its changes; the names say what they measure whatever
# the defaults become (`today` and `before` spell out every setting they differ in).
CONFIGS: dict[str, dict[str, Any]] = {
    BASELINE: {
        "base_dtype": "float32",
        "autocast": False,
        "middle_only": False,
        "checkpointing": False,
        "lora_dropout": 0.05,
    },
    "default": {},
    # The defaults until activation checkpointing went on and the LoRA dropout off.
    "before": {"checkpointing": False, "lora_dropout": 0.05},
    "no_checkpointing": {"checkpointing": False},
    "all_layers": {"checkpointing_every": 1},
    "unbounded_cache": {},
    "dropout": {"lora_dropout": 0.05},
    # The defaults in float32 whatever the CPU (the default where bfloat16 is not native).
    "float32": {"base_dtype": "float32", "autocast": False},
    "kl": {"kl_weight": 0.1},
}
# oneDNN's primitive cache where a configuration does not have the trainer's bound
# (`common.memory.bound_primitive_cache`): 1024 is oneDNN's own default.
PRIMITIVE_CACHE: dict[str, int] = {BASELINE: 1024, "before": 1024, "unbounded_cache": 1024}
DEFAULT_CONFIGS = "today,default,before"


def split_config(spec: str) -> tuple[str, int]:
    """`name` or `name@P` (P processes under torchrun, each with its share of the threads)."""
    name, _, processes = spec.partition("@")
    if not processes:
        return name, 1
    if not processes.isdigit() or int(processes) < 1:
        raise SystemExit(f"tabloop bench train: {spec!r}: processes after @ must be at least 1")
    return name, int(processes)


def settings_of(spec: str, args: argparse.Namespace) -> Any:
    """The `TrainSettings` of configuration `spec` (the shared choices from `args`)."""
    from training.lora import LoraShape
    from training.trainer import TrainSettings

    name, _processes = split_config(spec)
    if name not in CONFIGS:
        raise SystemExit(
            f"tabloop bench train: unknown configuration {name!r}: {', '.join(CONFIGS)}"
        )
    config = dict(CONFIGS[name])
    if "lora_dropout" in config:
        config["lora"] = LoraShape(dropout=config.pop("lora_dropout"))
    return TrainSettings(
        seed=args.seed,
        effective_batch=args.effective_batch,
        micro_batch=args.micro_batch,
        max_prompt_tokens=args.max_prompt_tokens,
        checkpoint_every=10_000,
        **config,
    )


def corpus_root(corpus: str) -> Path:
    """A directory: as given, or a package of the standard library by name."""
    path = Path(corpus)
    if path.is_dir():
        return path.resolve()
    stdlib = Path(sysconfig.get_paths()["stdlib"]) / corpus
    if not stdlib.is_dir():
        raise SystemExit(f"tabloop bench train: {corpus!r} is neither a directory nor a package")
    return stdlib


def first_built_micro_batch(settings: Any, trainable: Any) -> int:
    """The micro-batch the trainer as first built chose here: the memory rule on every device
    (`memory_micro_batch`), where the trainer now takes one example a pass on a CPU."""
    from training.memory import available_memory_bytes, bytes_per_example, memory_micro_batch

    sequence = settings.max_prompt_tokens + settings.max_middle_tokens + 8
    per_example = bytes_per_example(
        trainable.model.config, sequence, settings.max_middle_tokens + 1, checkpointing=False
    )
    return memory_micro_batch(settings.effective_batch, available_memory_bytes("cpu"), per_example)


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Train configuration `args.child` in this process and measure it."""
    import torch

    from training.budget import Budget
    from training.examples import split_files, stream_code_examples, workspace_files
    from training.trainer import Progress, Trainer
    from training.workspace import load_trainable

    name = split_config(args.child)[0]
    if name in PRIMITIVE_CACHE:  # before torch runs anything in this process
        os.environ[PRIMITIVE_CACHE_ENV] = str(PRIMITIVE_CACHE[name])
    torch.set_num_threads(args.threads)
    settings = settings_of(args.child, args)
    root = corpus_root(args.corpus)
    train_files, _held_out = split_files(workspace_files(root))
    started = time.perf_counter()
    trainable = load_trainable(args.model, Path(args.cache_dir), settings)
    load_s = time.perf_counter() - started
    loading_peak = _reset_peak_rss_mb()
    if name == BASELINE and not settings.micro_batch:
        settings = replace(settings, micro_batch=first_built_micro_batch(settings, trainable))
    from completion.fim import template_for

    steps: list[tuple[float, int, int]] = []

    def progress(p: Progress) -> None:
        steps.append((time.perf_counter(), p.samples, p.tokens))

    with tempfile.TemporaryDirectory(prefix="bench-train-") as work:
        trainer = Trainer(
            trainable.model,
            trainable.tokenizer,
            template_for(trainable.family),
            trainable.base_model_id,
            settings,
            Path(work),
            device="cpu",
        )
        began = time.perf_counter()
        cpu_began = time.process_time()
        result = trainer.run(
            lambda: stream_code_examples(root, train_files, args.seed),
            Budget(samples=args.samples),
            progress,
        )
        run_s = time.perf_counter() - began
        cpu_s = time.process_time() - cpu_began
    report: dict[str, Any] = {
        "config": args.child,
        "rank": int(os.environ.get("RANK", "0")),
        "processes": result.processes,
        "load_s": round(load_s, 2),
        "steps": result.steps,
        "samples": result.samples,
        "tokens": result.tokens,
        "run_s": round(run_s, 2),
        "samples_per_s": round(result.samples / run_s, 4),
        "tokens_per_s": round(result.tokens / run_s, 1),
        "cpu_s": round(cpu_s, 1),
        "samples_per_cpu_s": round(result.samples / cpu_s, 4),
        "micro_batch": result.micro_batch,
        "accumulation": result.accumulation,
        "final_loss": result.loss,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "peak_rss_loading_mb": loading_peak,
        "peak_rss_training_mb": _peak_rss_mb(),
        "settings": asdict(settings),
        # oneDNN's primitive cache as this process had it (`common.memory.bound_primitive_cache`)
        "onednn_primitive_cache_capacity": os.environ.get(PRIMITIVE_CACHE_ENV),
    }
    if len(steps) >= 2:
        (t0, s0, k0), (t1, s1, k1) = steps[0], steps[-1]
        report["after_first_step"] = {
            "samples_per_s": round((s1 - s0) / (t1 - t0), 4),
            "tokens_per_s": round((k1 - k0) / (t1 - t0), 1),
        }
    return report


def _peak_rss_mb() -> float | None:
    """The process's peak resident memory since it started or since the last reset (VmHWM)."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def _reset_peak_rss_mb() -> float | None:
    """The peak so far, then the peak reset (Linux: `5` to /proc/self/clear_refs), so that the
    next reading is the training's alone; None where it cannot be read or reset."""
    peak = _peak_rss_mb()
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
    except OSError:
        return None
    return peak


def _run_child(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """Configuration `name` trained in a process of its own (or `name@P`: P processes under
    torchrun, the threads shared out); its report (with several processes, the main process's,
    with every process's peak memory and the CPU time of them all)."""
    from training.launch import launch_command

    _name, processes = split_config(name)
    threads = max(1, args.threads // processes)
    arguments = [
        "--child", name,
        "--model", args.model, "--cache-dir", args.cache_dir, "--threads", str(threads),
        "--samples", str(args.samples), "--corpus", args.corpus, "--seed", str(args.seed),
        "--effective-batch", str(args.effective_batch), "--micro-batch", str(args.micro_batch),
        "--max-prompt-tokens", str(args.max_prompt_tokens),
    ]  # fmt: skip
    command = (
        [sys.executable, "-m", __name__, *arguments]
        if processes == 1
        else launch_command(processes, arguments, module=__name__)
    )
    print(f"bench train: {name}...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="tabloop-bench-train-") as reports_dir:
        # Each process writes a file of its own: under torchrun the processes share one stdout,
        # whose lines can interleave.
        done = subprocess.run(
            [*command, "--reports", reports_dir], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            return {"config": name, "error": done.stderr.strip().splitlines()[-3:]}
        reports = sorted(
            (json.loads(path.read_text()) for path in Path(reports_dir).glob("rank-*.json")),
            key=lambda r: int(r["rank"]),
        )
    if len(reports) != processes:
        return {"config": name, "error": [f"{len(reports)} reports from {processes} processes"]}
    report = dict(reports[0])
    if processes > 1:
        cpu_s = sum(float(r["cpu_s"]) for r in reports)
        report["threads_per_process"] = threads
        report["cpu_s"] = round(cpu_s, 1)
        report["samples_per_cpu_s"] = round(report["samples"] / cpu_s, 4) if cpu_s else None
        report["peak_rss_mb_per_process"] = [r["peak_rss_mb"] for r in reports]
        report["peak_rss_mb"] = round(sum(r["peak_rss_mb"] for r in reports), 1)
    return report


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tabloop bench train", description=__doc__)
    parser.add_argument("--model", default="bundled")
    parser.add_argument(
        "--configs",
        default=DEFAULT_CONFIGS,
        help=", ".join(CONFIGS) + " (NAME@P: on P processes under torchrun, the threads shared)",
    )
    parser.add_argument("--samples", type=int, default=64, help="training examples each")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--corpus", default="email", help="a directory or a stdlib package")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--effective-batch", type=int, default=8)
    parser.add_argument(
        "--micro-batch", type=int, default=0, help="examples per forward pass (0: from free memory)"
    )
    parser.add_argument("--max-prompt-tokens", type=int, default=384)
    parser.add_argument("--cache-dir", default="")
    parser.add_argument("--json", action="store_true", help="accepted; output is always JSON")
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    parser.add_argument("--reports", default="", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str]) -> int:
    """Measure each configuration in a child process; one JSON report, `today` the baseline."""
    args = _parser().parse_args(argv)
    if args.samples < 1 or args.threads < 1:
        raise SystemExit("tabloop bench train: --samples and --threads must be at least 1")
    if not args.cache_dir:
        from common.paths import default_cache_dir

        args.cache_dir = str(default_cache_dir())
    if args.child:
        report = child(args)
        Path(args.reports, f"rank-{report['rank']}.json").write_text(json.dumps(report))
        return 0
    names = [BASELINE] + [n for n in args.configs.split(",") if n and n != BASELINE]
    for name in names:
        settings_of(name, args)  # an unknown name fails before anything runs
    results = {name: _run_child(args, name) for name in names}
    base = results[BASELINE]
    ratios: dict[str, dict[str, float]] = {}
    for name, result in results.items():
        if "error" in result or "error" in base:
            continue
        ratios[name] = {
            key: round(result[key] / base[key], 3)
            for key in ("samples_per_s", "tokens_per_s", "samples_per_cpu_s", "peak_rss_mb")
            if result.get(key) and base.get(key)
        }
    report = {
        "benchmark": "train",
        "command": "tabloop bench train " + " ".join(argv),
        "model": args.model,
        "cpu": cpu_description(),
        "corpus": str(corpus_root(args.corpus)),
        "threads": args.threads,
        "samples_each": args.samples,
        "baseline": BASELINE,
        "results": results,
        "ratio_to_baseline": ratios,
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
