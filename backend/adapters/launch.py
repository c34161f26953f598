"""A tenant's adapter training on several processes: the processes torchrun starts for one run of
`backend.adapters.run.train_tenant` (`TenantRunOptions.processes` > 1), and the call that starts
them and reads the result.

The run that claims the job has already fixed the plan (the newest event row, the mark, the
version it warm-starts from) and exported the window's examples as shards (`backend.adapters.
shards`) in the run directory; every process reads the same plan and the same shards
(`training.streamed.rank_stream`), loads the model, and trains its share of each step
(`training.trainer`); the main process writes the adapter and prints the `TrainResult` as JSON,
which the claiming run registers, evaluates and promotes as it does a run in its own process.
Progress is not reported step by step from the processes (the report has the totals).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from dataclasses import asdict
from pathlib import Path

from backend.adapters.shards import SHARDS
from backend.storage import Storage
from training.budget import Budget
from training.launch import launch_command, settings_json, settings_of
from training.streamed import rank_stream
from training.trainer import TrainResult, TrainSettings
from training.window import WindowSettings
from training.workspace import RunPlan, WarmStart, load_trainable


class LaunchedRunError(RuntimeError):
    """The processes of a launched run failed; the message has the end of their output."""


def run_launched(
    processes: int,
    *,
    database_url: str,
    tenant: str,
    model: str,
    cache_dir: Path,
    run_dir: Path,
    settings: TrainSettings,
    budget: Budget,
    window: WindowSettings,
    warm: tuple[int, Path] | WarmStart,
    device: str | None,
) -> TrainResult:
    """Train the run in `run_dir` (its plan saved there) on `processes` processes of this machine
    under torchrun; the main process's result (its `warm_start` set)."""
    arguments = [
        "--db", database_url, "--tenant", tenant, "--model", model,
        "--cache-dir", str(cache_dir), "--run-dir", str(run_dir),
        "--settings", settings_json(settings), "--budget", json.dumps(asdict(budget)),
        "--window", json.dumps(asdict(window)),
    ]  # fmt: skip
    if isinstance(warm, WarmStart):
        arguments += ["--fresh-reason", warm.reason]
    else:
        arguments += ["--warm-version", str(warm[0]), "--warm-dir", str(warm[1])]
    if device:
        arguments += ["--device", device]
    command = launch_command(processes, arguments, module=__name__)
    done = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ))
    if done.returncode != 0:
        raise LaunchedRunError(
            f"the {processes} training processes failed ({done.returncode}): " + done.stderr[-2000:]
        )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return TrainResult(**report)


def main(argv: list[str] | None = None) -> int:
    """One process of a launched tenant run."""
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("--db", required=True)
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--cache-dir", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--settings", required=True)
    parser.add_argument("--budget", required=True)
    parser.add_argument("--window", required=True)
    parser.add_argument("--warm-version", type=int)
    parser.add_argument("--warm-dir", type=Path)
    parser.add_argument("--fresh-reason", default="not asked to warm-start")
    parser.add_argument("--device")
    args = parser.parse_args(argv)
    from accelerate.state import PartialState

    settings = settings_of(args.settings)
    storage = Storage(args.db, migrate=False)
    tenant_id = storage.tenant_id(args.tenant)
    plan = RunPlan.load(args.run_dir)
    if tenant_id is None or plan is None:
        parser.error(f"no tenant {args.tenant!r} or no run planned in {args.run_dir}")
    warm: tuple[int, Path] | WarmStart = (
        (args.warm_version, args.warm_dir)
        if args.warm_version is not None and args.warm_dir is not None
        else WarmStart(None, args.fresh_reason)
    )
    trainable = load_trainable(args.model, args.cache_dir, settings, warm)
    trainer = trainable.trainer(settings, args.run_dir, args.device)
    # The window's shards, which the launching process exported (`backend.adapters.run`).
    stream = rank_stream(args.run_dir / SHARDS)
    result = trainer.run(stream, Budget(**json.loads(args.budget)))
    result.warm_start = trainable.warm_start.summary()
    if PartialState().is_main_process:
        print(json.dumps(asdict(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
