"""`tabloop bench telemetry`: what recording costs the editor, what the backend ingests, and
whether an outage loses or duplicates anything.

- `enqueue_us_p50` / `enqueue_us_p99`: one `TelemetryClient.record()` of a ready event, as the
  language server calls it on its event loop (goal: p50 <= 100 µs). `build_enqueue_us_p50`
  adds building the decision event from an engine `Decision` (what the server really pays).
- `ingest_events_per_s`: events stored per second by the real backend (`tabloop backend` in its
  own process on loopback, SQLite), from `--concurrency` clients posting gzipped batches of 100
  (goal >= 10,000), with the best of the `--workers` counts measured (`ingest_workers`; the
  1-worker figures are `..._1_worker`). `ingest_events_per_backend_cpu_s` divides by the CPU
  time of the backend process and its workers instead of wall time: the figure that does not
  depend on what else the machine runs (see `load_average_1m`). `..._postgres` are the same on
  PostgreSQL when `--postgres URL` is given
  (use a database of its own: the benchmark adds a tenant and its events there).
- `lost` / `duplicates`: a client records `--outage-events` events at a steady pace while the
  backend is stopped and restarted mid-stream; afterwards, events recorded but not stored, and
  rows stored more than once (goal: 0 and 0).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from backend.local import LocalBackend, bind_loopback, wait_until_healthy
from backend.settings import BackendSettings, IngestLimits
from backend.storage import Storage
from completion.types import CompletionRequest, Decision, Timings
from lsp_server.features.telemetry import decision_event
from telemetry.client import TelemetryClient
from telemetry.events import OutcomeEvent
from telemetry.settings import TelemetrySettings

UNLIMITED = IngestLimits(rate_events_per_s=1e12, burst_events=1e12)
REPO_ROOT = Path(__file__).resolve().parents[2]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def sample_decision(i: int) -> tuple[Decision, CompletionRequest]:
    request = CompletionRequest(
        prefix="def f(x):\n    return ", suffix="\n", language="python", uri="file:///a.py"
    )
    decision = Decision(
        decision_id=uuid.uuid4().hex,
        action="show" if i % 3 else "silence",
        text="x + 1",
        propensity=0.7,
        policy_version="builtin-1",
        model_id="Qwen/Qwen2.5-Coder-0.5B",
        features={"language": "python", "suggestion_chars": 5.0, "cursor_column": 11.0},
        timings=Timings(context_ms=1.0, model_ms=40.0, total_ms=42.0),
    )
    return decision, request


def measure_enqueue(events: int, directory: Path) -> dict[str, float]:
    """Microseconds per `record()` call, with the writer thread running as in the server."""
    client = TelemetryClient(
        TelemetrySettings(queue_max_events=events * 2 + 10, spool_max_events=events * 3),
        directory,
    )
    client.start()
    ready = [OutcomeEvent(decision_id=f"d{i}", kind="ignored") for i in range(events)]
    samples: list[float] = []
    for event in ready:
        started = time.perf_counter_ns()
        client.record(event)
        samples.append((time.perf_counter_ns() - started) / 1000)
    built: list[float] = []
    for i in range(events):
        decision, request = sample_decision(i)
        started = time.perf_counter_ns()
        client.record(
            decision_event(decision, request, session_id="s", install_id="i", level=client.level)
        )
        built.append((time.perf_counter_ns() - started) / 1000)
    client.flush_to_spool(60)
    client.shutdown(0)
    return {
        "enqueue_us_p50": round(statistics.median(samples), 2),
        "enqueue_us_p99": round(percentile(samples, 0.99), 2),
        "build_enqueue_us_p50": round(statistics.median(built), 2),
        "enqueue_samples": events,
    }


def _batches(count: int, size: int) -> list[bytes]:
    bodies = []
    for b in range(count):
        events = [
            OutcomeEvent(decision_id=f"b{b}-{i}", kind="ignored").model_dump_json()
            for i in range(size)
        ]
        bodies.append(gzip.compress(('{"events":[' + ",".join(events) + "]}").encode()))
    return bodies


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its live child processes (the workers under
    `--workers N`), from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return own + sum(_cpu_seconds(int(child)) for child in children)


def measure_ingest(db_url: str, batches: int, concurrency: int, workers: int) -> dict[str, float]:
    """The backend in its own process (as deployed, with `workers` worker processes), fed
    batches of 100 by concurrent clients.

    Returns events stored per wall-clock second, and per CPU-second of the backend process (the
    figure that does not depend on what else the machine is doing).
    """
    bodies = _batches(batches, 100)
    storage = Storage(db_url)
    token = storage.create_token(f"bench-{uuid.uuid4().hex[:8]}")
    principal = storage.principal_for_token(token)
    assert principal is not None
    with bind_loopback() as probe:
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "backend.cli",
            "--port",
            str(port),
            "--db",
            db_url,
            "--rate",
            "1e12",
            "--workers",
            str(workers),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Encoding": "gzip",
        "Content-Type": "application/json",
    }
    failures: list[str] = []

    def post_share(share: list[bytes]) -> None:
        with httpx.Client(timeout=120) as http:
            for body in share:
                answer = http.post(f"{url}/v1/events", content=body, headers=headers)
                if answer.status_code != 200 or len(answer.json()["accepted"]) != 100:
                    failures.append(f"{answer.status_code}: {answer.text[:200]}")

    try:
        # Workers start one by one on a loaded machine.
        wait_until_healthy(url, server, timeout=180, interval=0.05)
        shares = [bodies[i::concurrency] for i in range(concurrency)]
        threads = [threading.Thread(target=post_share, args=(share,)) for share in shares]
        cpu_before = _cpu_seconds(server.pid)
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        cpu = _cpu_seconds(server.pid) - cpu_before
    finally:
        server.terminate()
        server.wait(30)
    if failures:
        raise RuntimeError(f"{len(failures)} batches failed, first: {failures[0]}")
    stored = len(storage.event_ids(principal.tenant_id))
    storage.close()
    return {"per_s": stored / elapsed, "per_cpu_s": stored / cpu if cpu else float("nan")}


def _ingest_figures(
    suffix: str, database: Callable[[], str], batches: int, concurrency: int, workers: list[int]
) -> dict[str, Any]:
    """Ingest figures for each worker count: the best by wall clock, and the 1-worker one."""
    rates = {n: measure_ingest(database(), batches, concurrency, n) for n in sorted(set(workers))}
    best = max(rates, key=lambda n: rates[n]["per_s"])
    figures: dict[str, Any] = {
        f"ingest_events_per_s{suffix}": round(rates[best]["per_s"]),
        f"ingest_events_per_backend_cpu_s{suffix}": round(rates[best]["per_cpu_s"]),
        f"ingest_workers{suffix}": best,
    }
    if 1 in rates:
        figures[f"ingest_events_per_s_1_worker{suffix}"] = round(rates[1]["per_s"])
        figures[f"ingest_events_per_backend_cpu_s_1_worker{suffix}"] = round(rates[1]["per_cpu_s"])
    return figures


def measure_outage(events: int, outage_s: float, directory: Path) -> dict[str, Any]:
    """Record through a backend outage; count what was lost or stored twice."""
    with LocalBackend(tenant="outage", settings=BackendSettings(limits=UNLIMITED)) as backend:
        settings = TelemetrySettings(
            backend_url=backend.url,
            token=backend.token,
            flush_interval_s=0.05,
            backoff_initial_s=0.05,
            backoff_max_s=0.5,
            retry_deadline_s=5.0,
        )
        client = TelemetryClient(settings, directory)
        client.start()
        recorded: set[str] = set()
        pace = 2.0 / events  # spread over about two seconds plus the outage
        stop_at, restart_at = events // 3, None
        for i in range(events):
            event = OutcomeEvent(decision_id=f"o{i}", kind="ignored")
            if client.record(event):
                recorded.add(str(event.event_id))
            if i == stop_at:
                backend.stop_serving()
                restart_at = time.monotonic() + outage_s
            if restart_at is not None and time.monotonic() >= restart_at:
                backend.start_serving()
                restart_at = None
            time.sleep(pace)
        if restart_at is not None:
            time.sleep(max(0.0, restart_at - time.monotonic()))
            backend.start_serving()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if client.flush_to_spool(5) and client.spool is not None and len(client.spool) == 0:
                break
            time.sleep(0.05)
        client.shutdown(5)
        rows = backend.stored_ids()
    return {
        "outage_events": len(recorded),
        "outage_s": outage_s,
        "lost": len(recorded - set(rows)),
        "duplicates": len(rows) - len(set(rows)),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tabloop bench telemetry", description=__doc__)
    parser.add_argument("--enqueue-events", type=int, default=20_000)
    parser.add_argument("--batches", type=int, default=200, help="ingest batches of 100")
    parser.add_argument("--concurrency", type=int, default=4, help="concurrent ingest clients")
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1, os.cpu_count() or 1],
        help="backend worker counts to measure; the best is reported, 1 worker beside it",
    )
    parser.add_argument("--postgres", help="also measure ingestion on this PostgreSQL URL")
    parser.add_argument("--outage-events", type=int, default=5000)
    parser.add_argument("--outage-s", type=float, default=1.0)
    parser.add_argument("--json", action="store_true", help="print JSON (the only output form)")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tabloop-bench-telemetry-") as tmp:
        root = Path(tmp)
        result.update(measure_enqueue(args.enqueue_events, root / "enqueue"))
        databases = {"": lambda: f"sqlite:///{root / f'ingest-{uuid.uuid4().hex}.sqlite3'}"}
        if args.postgres:
            databases["_postgres"] = lambda: args.postgres
        for suffix, database in databases.items():
            result.update(
                _ingest_figures(suffix, database, args.batches, args.concurrency, args.workers)
            )
        result["ingest_batch_events"] = 100
        result["ingest_concurrency"] = args.concurrency
        result.update(measure_outage(args.outage_events, args.outage_s, root / "outage"))
        result["load_average_1m"] = os.getloadavg()[0]
        result["cpus"] = os.cpu_count()
    print(json.dumps(result, indent=2))
    return 0 if result["lost"] == 0 and result["duplicates"] == 0 else 1
