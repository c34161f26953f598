"""`tabloop eval adapter`: an adapter's completions on a directory's held-out files, against the
base model or another adapter, on the same cursors in one run.

    tabloop eval adapter --corpus DIR --adapter PATH [--baseline-adapter PATH] [--n 100]
                         [--seed 0] --json

The held-out files are those `tabloop train model` leaves out of training (the hash split of
`training.examples.split_files`), as `tabloop train edits --completion-share` leaves them out of
a repository's snapshot, so an adapter trained there is judged on files it never read. The
cursors and the figures are those a version of the loop is judged by (`training.evaluate`):
exact first line and edit similarity per version, and the paired differences (the adapter's
minus the baseline's) with their 95% intervals; on the configured engine when it is a fast one,
which merges and converts each adapter once.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from common.machine import cpu_description
from lsp_server import config
from training.evaluate import compare, held_out_cursors, judging_runner
from training.examples import split_files, workspace_files


def torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tabloop eval adapter", description=__doc__)
    parser.add_argument("--corpus", required=True, help="directory of source files")
    parser.add_argument("--adapter", required=True, help="adapter directory to judge")
    parser.add_argument(
        "--baseline-adapter", help="judge against this adapter (default: the base model)"
    )
    parser.add_argument("--n", type=int, default=100, help="cursors in the held-out files")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output form)")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error("--n must be at least 1")
    for flag, value in (("--adapter", args.adapter), ("--baseline-adapter", args.baseline_adapter)):
        if value is not None and not Path(value).is_dir():
            parser.error(f"{flag} {value} is not a directory")
    if not Path(args.corpus).is_dir():
        parser.error(f"--corpus {args.corpus} is not a directory")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    corpus = Path(args.corpus).resolve()
    settings = config.resolve(corpus).settings
    _, held_out = split_files(workspace_files(corpus))
    cursors = held_out_cursors(corpus, held_out, args.n, args.seed)
    if not cursors:
        raise SystemExit(f"tabloop eval adapter: {corpus} has no held-out file to complete")
    completion = settings.completion.model_copy(
        update={"adapter": "", "context_timeout_ms": 60_000}
    )
    baseline = Path(args.baseline_adapter).resolve() if args.baseline_adapter else None
    adapter = Path(args.adapter).resolve()
    started = time.perf_counter()
    runner = judging_runner(completion, settings.cache_path())
    try:
        base_model_id = runner.model_id
        describe = getattr(runner, "describe", None)  # the fast engines: threads, weights
        loaded = describe() if describe is not None else {"threads": torch_threads()}
        judged = compare(runner, completion, baseline, adapter, cursors)
    finally:
        runner.close()
    report: dict[str, Any] = {
        "command": "tabloop eval adapter " + " ".join(argv),
        "cpu": cpu_description(),
        "configuration": {
            "model": completion.model,
            "model_id": base_model_id,
            "engine": judged.pop("engine"),
            "dtype": completion.dtype,
            "threads": completion.threads,
            "loaded": {key: value for key, value in loaded.items() if key != "adapter"},
            "adapter": str(adapter),
            "baseline": str(baseline) if baseline else "base model",
        },
        "corpus": str(corpus),
        "held_out_files": held_out,
        "seed": args.seed,
        # `serving` is the baseline, `candidate` the adapter judged.
        "judged": judged,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(report, indent=2))
    return 0
