"""A workspace's training run on several processes: the entry point `accelerate launch` or
`torchrun` starts once per process, and the command that starts it.

Every process builds the same `training.workspace` run (same model, settings, data stream and
run directory) and trains its share of each step (`training.trainer`); the main process writes
the adapter and prints the run's report as JSON. Each process may also write its own report
(`--reports DIR`: `rank-N.json`, whose `weights_sha256` is the digest of its LoRA weights),
which is how a test checks that the processes agree.

    torchrun --standalone --nproc_per_node 2 -m training.launch --workspace W --work-dir D ...
    accelerate launch --num_processes 2 --cpu -m training.launch --workspace W --work-dir D ...
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, fields
from pathlib import Path

from training.budget import Budget
from training.lora import LoraShape
from training.trainer import TrainSettings


def settings_json(settings: TrainSettings) -> str:
    """`settings` as the JSON `--settings` takes."""
    return json.dumps(asdict(settings), sort_keys=True)


def settings_of(text: str) -> TrainSettings:
    """The `TrainSettings` of `settings_json`'s text (ValueError for an unknown field)."""
    data = json.loads(text)
    known = {f.name for f in fields(TrainSettings)}
    if unknown := sorted(set(data) - known):
        raise ValueError(f"unknown training settings: {', '.join(unknown)}")
    if "lora" in data:
        lora = dict(data["lora"])
        if "targets" in lora:
            lora["targets"] = tuple(lora["targets"])
        data["lora"] = LoraShape(**lora)
    return TrainSettings(**data)


def launch_command(processes: int, arguments: list[str], *, module: str = __name__) -> list[str]:
    """The command that runs `python -m module arguments` in `processes` processes on this
    machine under torchrun (gloo on CPUs, NCCL on GPUs, chosen by accelerate in each)."""
    if processes < 1:
        raise ValueError(f"processes must be at least 1, not {processes}")
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc_per_node", str(processes), "-m", module, *arguments,
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Train a workspace's adapter in this process, one of those the launcher started."""
    parser = argparse.ArgumentParser(
        prog="python -m training.launch",
        description="One process of a workspace's training run started by accelerate launch "
        "or torchrun; the main process prints the run's report.",
    )
    parser.add_argument("--workspace", type=Path, required=True)
    parser.add_argument("--model", required=True, help="base model (id or local path)")
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--work-dir", type=Path, required=True, help="seen by every process")
    parser.add_argument("--samples", type=int, help="budget in training examples")
    parser.add_argument("--seconds", type=float, help="budget in seconds")
    parser.add_argument("--settings", default="{}", help="TrainSettings as JSON")
    parser.add_argument("--device", help="cpu or cuda (default: cuda when present)")
    parser.add_argument("--reports", type=Path, help="each process writes rank-N.json here")
    args = parser.parse_args(argv)
    try:
        settings = settings_of(args.settings)
        budget = Budget(samples=args.samples, seconds=args.seconds)
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))

    from accelerate.state import PartialState

    from training.workspace import train_workspace

    result, _ = train_workspace(
        args.workspace,
        model=args.model,
        cache_dir=args.cache_dir,
        work_dir=args.work_dir,
        budget=budget,
        settings=settings,
        device=args.device,
    )
    state = PartialState()
    report = asdict(result)
    if args.reports is not None:
        args.reports.mkdir(parents=True, exist_ok=True)
        own = {**report, "rank": state.process_index}
        (args.reports / f"rank-{state.process_index}.json").write_text(json.dumps(own))
    if state.is_main_process:
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
