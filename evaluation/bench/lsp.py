"""`tabloop bench lsp`: what the server itself costs, apart from the model.

- `initialize_ms_p50`: `initialize` round trip over stdio, over several fresh server processes.
- `overhead_ms_p50` / `overhead_ms_p95`: per inline-completion request, the client's round trip
  minus the time the server spent in the model runner (measured by the server for that same
  request), over at least 200 requests on a real standard-library file with the tiny test model.
- `baseline_roundtrip_ms_p50` (the baseline, measured in the same run on the same connection):
  the round trip of `tabloop/status`, a request that runs no completion, sent before each
  inline request so that the machine's load falls on both alike. The overhead above it is what
  the completion path itself costs; `model_ms_p50` (the part excluded) is printed beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from evaluation.demo import make_workspace
from evaluation.lsp_client import TabloopClient
from lsp_server.protocol import STATUS_REQUEST, TIMINGS_REQUEST

REPO_ROOT = Path(__file__).resolve().parents[2]


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def tiny_model() -> Path:
    """The test suite's tiny model (committed under tests/fixtures/)."""
    sys.path.insert(0, str(REPO_ROOT))
    from tests.support.fixtures import tiny_model_path

    return tiny_model_path()


async def measure_initialize(
    runs: int, workspace: Path, cache_dir: Path, *, wait_until_listening: bool
) -> list[float]:
    """`initialize` round trips over fresh servers (the model loads in the background)."""
    times = []
    for _ in range(runs):
        client = TabloopClient()
        times.append(
            await client.launch(
                workspace,
                {"cacheDir": str(cache_dir), "index": {"enabled": False}},
                wait_until_listening=wait_until_listening,
            )
        )
        await client.close_server()
    return times


async def measure_overhead(
    requests: int, workspace: Path, model: Path, cache_dir: Path, seed: int
) -> dict[str, Any]:
    client = TabloopClient()
    await client.launch(
        workspace,
        {
            "cacheDir": str(cache_dir),
            "completion": {"model": str(model), "maxNewTokens": 8},
            "index": {"enabled": False},
            "telemetry": {"level": "off"},
        },
    )
    status = await client.wait_until_ready(300)
    if status["model"]["state"] != "ready":
        raise RuntimeError(f"model not ready: {status['model']}")
    path = sorted(workspace.glob("*.py"))[0]
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    uri = client.open(path, text)
    rng = random.Random(seed)
    roundtrips: list[float] = []
    baseline: list[float] = []
    for _ in range(requests):
        line = rng.randrange(len(lines))
        character = rng.randrange(len(lines[line]) + 1)
        started = time.perf_counter()
        await client.status()
        baseline.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        await client.inline(uri, line, character)
        roundtrips.append((time.perf_counter() - started) * 1000)
    server_timings: list[dict[str, float]] = await client.protocol.send_request_async(
        TIMINGS_REQUEST, {}
    )
    await client.close_server()
    timings = [t if isinstance(t, dict) else t._asdict() for t in server_timings][-requests:]
    if len(timings) != requests:
        raise RuntimeError(f"server timed {len(timings)} of {requests} requests")
    model_ms = [t["model_ms"] for t in timings]
    overhead = [rt - m for rt, m in zip(roundtrips, model_ms, strict=True)]
    return {
        "requests": requests,
        "overhead_ms_p50": round(percentile(overhead, 0.5), 3),
        "overhead_ms_p95": round(percentile(overhead, 0.95), 3),
        "roundtrip_ms_p50": round(percentile(roundtrips, 0.5), 3),
        "baseline_roundtrip_ms_p50": round(percentile(baseline, 0.5), 3),
        "baseline_request": STATUS_REQUEST,
        "model_ms_p50": round(percentile(model_ms, 0.5), 3),
        "context_ms_p50": round(percentile([t["context_ms"] for t in timings], 0.5), 3),
        "file": path.name,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    model = Path(args.model) if args.model else tiny_model()
    with tempfile.TemporaryDirectory(prefix="tabloop-bench-lsp-") as scratch:
        workspace = Path(scratch) / "workspace"
        make_workspace(workspace)
        cache_dir = Path(scratch) / "cache"
        initialize = await measure_initialize(
            args.initialize_runs, workspace, cache_dir, wait_until_listening=True
        )
        cold = await measure_initialize(
            args.initialize_runs, workspace, cache_dir, wait_until_listening=False
        )
        overhead = await measure_overhead(args.requests, workspace, model, cache_dir, args.seed)
    return {
        "initialize_ms_p50": round(statistics.median(initialize), 3),
        "initialize_ms_max": round(max(initialize), 3),
        "initialize_runs": len(initialize),
        # From spawning the process: adds the interpreter's start-up and imports.
        "spawn_to_initialize_ms_p50": round(statistics.median(cold), 3),
        **overhead,
        "model": str(model),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tabloop bench lsp", description=__doc__)
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--initialize-runs", type=int, default=7)
    parser.add_argument("--model", help="model directory (default: the tiny test model)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output form)")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    return 0
