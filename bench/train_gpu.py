"""The adapter trainer on one CUDA GPU with bfloat16: samples/s, peak memory, time to a servable
version. Nothing needs a GPU; this script does, and says so where there is none.

It trains a fresh LoRA adapter of `--model` (default: the bundled completion model) with the same
`Trainer` as a tenant's or a workspace's run (bfloat16 base weights, accelerate's bf16 mixed
precision, the micro-batch sized from free GPU memory, halved on an out-of-memory error) on the
fill-in-the-middle examples of a code corpus (a directory, or a standard-library package by name),
for `--seconds` of training, then adds the adapter to a fresh registry and promotes it: the time
from the start of the script to that promotion is the time to a servable version. It prints one
JSON object: samples/s and tokens/s (whole run, and after the first optimiser step, which pays
for allocating every buffer), the GPU's peak allocated and reserved memory, the load, train and
register times, the micro-batch and the settings. The defaults finish within 4 minutes on a
current data-centre GPU (loading included).

    python bench/train_gpu.py [--seconds 120 | --samples N] [--model bundled] [--corpus email]
                              [--effective-batch 16] [--max-prompt-tokens 384] [--dry-run]

`--dry-run` checks the arguments and prints the settings it would train with, without a GPU.
Its test (`tests/training/test_train_gpu_bench.py`) runs the same `train` on the CPU with the tiny
model, so every step but CUDA's counters runs in CI.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

NO_GPU = 2
"""Exit status where no CUDA GPU is present (the message says so)."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench/train_gpu.py",
        description="Train an adapter on one CUDA GPU with bfloat16 and print samples/s, peak "
        "memory and the time to a servable version as JSON.",
    )
    parser.add_argument("--model", default="bundled", help="a completion.model value")
    parser.add_argument("--cache-dir", help="model cache (default: tabloop's)")
    parser.add_argument(
        "--corpus", default="email", help="a directory, or a standard-library package"
    )
    parser.add_argument("--seconds", type=float, default=120.0, help="training budget")
    parser.add_argument(
        "--samples", type=int, default=0, help="a budget in examples instead (0: --seconds)"
    )
    parser.add_argument("--effective-batch", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=0, help="0: sized from free memory")
    parser.add_argument("--max-prompt-tokens", type=int, default=384)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dry-run", action="store_true", help="check the arguments; train nothing")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.samples < 0:
        parser.error("--seconds must be positive (and --samples at least 0)")
    if args.effective_batch < 1 or args.micro_batch < 0:
        parser.error("--effective-batch must be at least 1 and --micro-batch at least 0")
    if args.micro_batch > args.effective_batch:
        parser.error("--micro-batch cannot be larger than --effective-batch")
    return args


def settings_of(args: argparse.Namespace) -> Any:
    """The run's `TrainSettings`: a bfloat16 base under bf16 autocast."""
    from training.trainer import TrainSettings

    return TrainSettings(
        seed=args.seed,
        effective_batch=args.effective_batch,
        micro_batch=args.micro_batch,
        max_prompt_tokens=args.max_prompt_tokens,
        checkpoint_every=1_000_000,  # measured without checkpoints
        base_dtype="bfloat16",
        autocast=True,
    )


def corpus_root(corpus: str) -> Path:
    """A directory, or a standard-library package by name (as `tabloop bench train` reads)."""
    from evaluation.bench.train import corpus_root as named

    return named(corpus)


class _Meter:
    """The device's clock and memory counters: CUDA's; on the CPU (the script's own test, with
    the tiny model) none, as the numbers would describe nothing a GPU user sees."""

    def __init__(self, device: str) -> None:
        import torch

        self.cuda = torch.cuda if device == "cuda" else None

    def reset(self) -> None:
        if self.cuda is not None:
            self.cuda.reset_peak_memory_stats()

    def synchronize(self) -> None:
        if self.cuda is not None:
            self.cuda.synchronize()

    def report(self) -> dict[str, Any]:
        if self.cuda is None:
            return {"gpu": None, "peak_allocated_gb": None, "peak_reserved_gb": None}
        return {
            "gpu": self.cuda.get_device_name(),
            "peak_allocated_gb": round(self.cuda.max_memory_allocated() / 2**30, 3),
            "peak_reserved_gb": round(self.cuda.max_memory_reserved() / 2**30, 3),
        }


def train(args: argparse.Namespace, device: str = "cuda") -> dict[str, Any]:
    """Train, register and promote on `device` (the script: the GPU); the report."""
    import torch

    from common.paths import default_cache_dir
    from completion.adapters import read_manifest, verify_adapter
    from training.budget import Budget
    from training.examples import split_files, stream_code_examples, workspace_files
    from training.registry import AdapterRegistry
    from training.trainer import Progress
    from training.workspace import load_trainable

    started = time.perf_counter()
    settings = settings_of(args)
    root = corpus_root(args.corpus)
    train_files, _ = split_files(workspace_files(root))
    cache = Path(args.cache_dir) if args.cache_dir else default_cache_dir()
    trainable = load_trainable(args.model, cache, settings)
    load_s = time.perf_counter() - started
    steps: list[tuple[float, int, int]] = []
    meter = _Meter(device)

    def progress(p: Progress) -> None:
        steps.append((time.perf_counter(), p.samples, p.tokens))

    budget = Budget(samples=args.samples) if args.samples else Budget(seconds=args.seconds)
    with tempfile.TemporaryDirectory(prefix="bench-train-gpu-") as work:
        trainer = trainable.trainer(settings, Path(work) / "run", device)
        meter.reset()
        began = time.perf_counter()
        result = trainer.run(
            lambda: stream_code_examples(root, train_files, args.seed), budget, progress
        )
        meter.synchronize()
        train_s = time.perf_counter() - began
        registering = time.perf_counter()
        adapter = Path(result.adapter)
        verify_adapter(adapter, trainable.base_model_id)
        registry = AdapterRegistry(Path(work) / "registry")
        record = registry.add(adapter, read_manifest(adapter)["base_model"], asdict(result))
        registry.promote(record.version, force=True)
        servable = registry.serving_path()
        if servable is None:
            raise RuntimeError("the promoted version does not serve")
        verify_adapter(servable, trainable.base_model_id)
        register_s = time.perf_counter() - registering
    report: dict[str, Any] = {
        **meter.report(),
        "device": device,
        "model": trainable.base_model_id,
        "corpus": str(root),
        "samples": result.samples,
        "tokens": result.tokens,
        "steps": result.steps,
        "samples_per_s": round(result.samples / train_s, 3),
        "tokens_per_s": round(result.tokens / train_s, 1),
        "load_s": round(load_s, 2),
        "train_s": round(train_s, 2),
        "register_s": round(register_s, 2),
        "time_to_servable_s": round(time.perf_counter() - started, 2),
        "served_version": record.version,
        "micro_batch": result.micro_batch,
        "accumulation": result.accumulation,
        "mixed_precision": result.mixed_precision,
        "final_loss": result.loss,
        "torch": torch.__version__,
        "settings": asdict(settings),
    }
    if len(steps) >= 2:
        (t0, s0, k0), (t1, s1, k1) = steps[0], steps[-1]
        report["after_first_step"] = {
            "samples_per_s": round((s1 - s0) / (t1 - t0), 3),
            "tokens_per_s": round((k1 - k0) / (t1 - t0), 1),
        }
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        settings = settings_of(args)
        corpus = str(corpus_root(args.corpus))
        print(json.dumps({"dry_run": True, "corpus": corpus, "settings": asdict(settings)}))
        return 0
    import torch

    if not torch.cuda.is_available():
        print(
            "bench/train_gpu.py: no CUDA GPU here (torch.cuda.is_available() is False); "
            "run it on a machine with one, or pass --dry-run to check the arguments",
            file=sys.stderr,
        )
        return NO_GPU
    if not torch.cuda.is_bf16_supported():
        print("bench/train_gpu.py: this GPU has no bfloat16", file=sys.stderr)
        return NO_GPU
    print(json.dumps(train(args), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
