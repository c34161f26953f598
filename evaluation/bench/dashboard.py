"""`tabloop bench dashboard`: the Overview query for one tenant holding many events, on PostgreSQL.

    tabloop bench dashboard --postgres URL [--events 10000000] [--runs 5] [--json]

In a fresh database next to URL (dropped afterwards unless `--keep`), one tenant gets `--events`
telemetry events spread over the last 30 days, as clients make them (a decision per request,
an outcome for most shown ones, retention measurements for accepted ones), bulk-loaded with
PostgreSQL's COPY (the events table's secondary indexes are dropped for the load and built
again after it, as one bulk-loads). Then:

- `baseline_24h_s`: the 24-hour Overview computed from the raw events alone (no rollup: every
  event of the window aggregated at query time), one run: what the query costs without the
  rollup. The 30-day one (`baseline_30d_s`) only up to `--baseline-30d-max` events: at 10
  million it aggregates all of them and takes minutes.
- `rollup_build_s`: folding every event into the rollup (`StatsRollup.refresh`, once; later
  refreshes fold only new events).
- `overview_24h_s` / `overview_30d_s`: the Overview (`StatsService.overview`, the code behind
  `GET /v1/stats/overview`) after one warm-up run, p50 (and max) of `--runs` runs. The goal is
  under one second for both windows at 10 million events.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from backend.policy.registry import PolicyRegistry
from backend.services.stats import StatsService
from backend.services.stats_rollup import StatsRollup
from backend.storage import Storage

DAYS = 30
LANGUAGES = ("python", "typescript", "go", "rust", "java")
EDITORS = (("vscode", "1.96.0"), ("neovim", "0.12.0"), ("zed", "0.170.0"))
VERSIONS = ("builtin", "v1", "v2", "v3")
SECONDARY = (
    "CREATE UNIQUE INDEX uq_events_tenant_event_tmp ON events (tenant_id, event_id)",
    "CREATE INDEX ix_events_tenant_decision ON events (tenant_id, decision_id)",
    "CREATE INDEX ix_events_tenant_type_id ON events (tenant_id, type, id)",
)


@contextmanager
def fresh_database(base: str, keep: bool) -> Iterator[str]:
    """A new, empty database next to `base` (URL), dropped on exit unless `keep`."""
    name = f"tabloop_bench_{uuid.uuid4().hex[:10]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        if not keep:
            with admin.connect() as connection:
                connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _uuid(rng: random.Random) -> str:
    text = f"{rng.getrandbits(128):032x}"
    return f"{text[:8]}-{text[8:12]}-4{text[13:16]}-a{text[17:20]}-{text[20:]}"


def _rows(rng: random.Random, now: float, tenant_id: int, total: int) -> Iterator[str]:
    """Lines of COPY's text format for the events table, `total` of them: requests and what
    followed each. The bodies are what the schema dumps (every field, in its order), written
    from templates: JSON encoding per event would make Python, not PostgreSQL, the bottleneck.
    None of the values needs escaping (no tab, newline or backslash)."""
    made = 0
    span = DAYS * 86_400 - 700  # leaves room for the 600 s retention checkpoint
    prefix = f"{tenant_id}\t"

    def stamp(epoch: float) -> str:
        return datetime.fromtimestamp(epoch, UTC).isoformat()

    while made < total:
        age = rng.uniform(700, span)
        at = stamp(now - age)
        decision_id = f"{rng.getrandbits(128):032x}"
        version = VERSIONS[min(3, int((span - age) / span * 4))]
        language = LANGUAGES[min(4, int(rng.expovariate(1.0)))]
        editor, editor_version = EDITORS[min(2, int(rng.expovariate(1.2)))]
        show = rng.random() < 0.6
        chars = rng.randint(4, 160) if show else 0
        latency = round(rng.lognormvariate(4.3, 0.6), 1)
        action = "show" if show else "silence"
        reason = "null" if show else '"' + rng.choice(("policy", "empty", "latency")) + '"'
        event_id = _uuid(rng)
        body = (
            f'{{"schema_version": 2, "event_id": "{event_id}", "time": "{at}", '
            f'"type": "decision", "decision_id": "{decision_id}", '
            f'"session_id": "s{decision_id[:8]}", "install_id": "i{decision_id[8:14]}", '
            f'"language": "{language}", "trigger": "automatic", "policy_version": "{version}", '
            f'"model_id": "qwen2.5-coder-0.5b", "action": "{action}", "propensity": 0.93, '
            f'"features": {{"prefix_chars": {rng.randint(0, 4000)}.0, '
            f'"line_chars": {rng.randint(0, 90)}.0, "mid_word": 0.0, '
            f'"language": "{language}", "logprob_mean": -0.41}}, '
            f'"suggestion_chars": {chars}, "suggestion_lines": {1 if show else 0}, '
            f'"latency": {{"context_ms": 1.2, "model_ms": {latency}, '
            f'"total_ms": {latency + 2.0:.1f}}}, "cache_hit": false, "prompt": null, '
            f'"suggestion": null, "silence_reason": {reason}, "client_name": "{editor}", '
            f'"client_version": "{editor_version}", "request_id": null, "rank": 0, '
            f'"candidates": 1}}'
        )
        yield f"{prefix}{event_id}\tdecision\t{decision_id}\t{action}\t{at}\t{at}\t{body}\n"
        made += 1
        if not show or made >= total:
            continue
        roll = rng.random()
        kind = "accepted" if roll < 0.3 else "partial" if roll < 0.4 else "ignored"
        accepted = chars if kind == "accepted" else chars // 2 if kind == "partial" else None
        later = now - age + 2
        outcome_at = stamp(later)
        event_id = _uuid(rng)
        why = "null" if accepted is not None else '"diverged"'
        body = (
            f'{{"schema_version": 2, "event_id": "{event_id}", "time": "{outcome_at}", '
            f'"type": "outcome", "decision_id": "{decision_id}", "kind": "{kind}", '
            f'"accepted_chars": {"null" if accepted is None else accepted}, '
            f'"reason": {why}, '
            f'"time_to_outcome_ms": 2000.0}}'
        )
        yield (
            f"{prefix}{event_id}\toutcome\t{decision_id}\t{kind}\t{outcome_at}\t"
            f"{outcome_at}\t{body}\n"
        )
        made += 1
        if not accepted:
            continue
        kept = accepted
        for after_s in (30, 120, 600):
            if made >= total:
                break
            kept = max(0, kept - rng.randint(0, 3))
            measured = stamp(later + after_s)
            event_id = _uuid(rng)
            body = (
                f'{{"schema_version": 2, "event_id": "{event_id}", "time": "{measured}", '
                f'"type": "retention", "decision_id": "{decision_id}", "after_s": {after_s}, '
                f'"accepted_chars": {accepted}, "retained_chars": {kept}}}'
            )
            yield (
                f"{prefix}{event_id}\tretention\t{decision_id}\t{after_s}\t{measured}\t"
                f"{measured}\t{body}\n"
            )
            made += 1


def seed(url: str, tenant_id: int, total: int, seed_value: int) -> float:
    """COPY `total` events of the tenant into the events table; seconds taken."""
    import psycopg

    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    rng = random.Random(seed_value)
    now = time.time()
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute("ALTER TABLE events DROP CONSTRAINT uq_events_tenant_event")
        connection.execute("DROP INDEX ix_events_tenant_decision")
        connection.execute("DROP INDEX ix_events_tenant_type_id")
        with (
            connection.cursor() as cursor,
            cursor.copy(
                "COPY events (tenant_id, event_id, type, decision_id, label, time, received_at,"
                " body) FROM STDIN"
            ) as copy,
        ):
            lines: list[str] = []
            for line in _rows(rng, now, tenant_id, total):
                lines.append(line)
                if len(lines) == 2000:
                    copy.write("".join(lines))
                    lines.clear()
            copy.write("".join(lines))
        for statement in SECONDARY:
            connection.execute(statement)
        connection.execute(
            "ALTER TABLE events ADD CONSTRAINT uq_events_tenant_event "
            "UNIQUE USING INDEX uq_events_tenant_event_tmp"
        )
        connection.execute("VACUUM ANALYZE events")
    return time.perf_counter() - started


def _timed(run: Any) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def measure(
    url: str, events: int, runs: int, seed_value: int, baseline_30d_max: int
) -> dict[str, Any]:
    storage = Storage(url)
    try:
        tenant_id = storage.ensure_tenant("bench")
        load_s = seed(url, tenant_id, events, seed_value)
        registry = PolicyRegistry(storage)
        # Never rolls up: every query aggregates the raw events of its window.
        raw = StatsService(storage, registry, StatsRollup(storage, settle_s=1e12))
        baseline = {"24h": _timed(lambda: raw.overview(tenant_id, "24h"))}
        if events <= baseline_30d_max:
            baseline["30d"] = _timed(lambda: raw.overview(tenant_id, "30d"))
        rollup = StatsRollup(storage, settle_s=0)
        stats = StatsService(storage, registry, rollup)
        build_s = _timed(lambda: rollup.refresh(tenant_id))
        with storage.engine.connect() as connection:
            connection.execute(text("ANALYZE stats_rollup"))
            rollup_rows = connection.execute(text("SELECT count(*) FROM stats_rollup")).scalar()
            size = connection.execute(text("SELECT pg_total_relation_size('events')")).scalar()
        timings: dict[str, list[float]] = {}
        answers: dict[str, Any] = {}
        for window in ("24h", "30d"):
            answers[window] = stats.overview(tenant_id, window)  # warm-up
            timings[window] = [
                _timed(lambda w=window: stats.overview(tenant_id, w)) for _ in range(runs)
            ]
        return {
            "events": events,
            "days": DAYS,
            "load_s": round(load_s, 1),
            "events_table_bytes": int(size or 0),
            "baseline_24h_s": round(baseline["24h"], 3),
            "baseline_30d_s": round(baseline["30d"], 3) if "30d" in baseline else None,
            "rollup_build_s": round(build_s, 1),
            "rollup_rows": int(rollup_rows or 0),
            "overview_24h_s": round(statistics.median(timings["24h"]), 4),
            "overview_24h_max_s": round(max(timings["24h"]), 4),
            "overview_30d_s": round(statistics.median(timings["30d"]), 4),
            "overview_30d_max_s": round(max(timings["30d"]), 4),
            "runs": runs,
            "requests_24h": answers["24h"]["summary"]["requests"],
            "requests_30d": answers["30d"]["summary"]["requests"],
            "goal_s": 1.0,
        }
    finally:
        storage.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tabloop bench dashboard",
        description="time the dashboard's Overview for one tenant with many events (PostgreSQL)",
    )
    parser.add_argument(
        "--postgres",
        default=os.environ.get("TABLOOP_TEST_POSTGRES_URL"),
        help="a PostgreSQL URL whose server may create a scratch database "
        "(default: $TABLOOP_TEST_POSTGRES_URL)",
    )
    parser.add_argument("--events", type=int, default=1_000_000, help="events of the tenant")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per window")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument(
        "--baseline-30d-max",
        type=int,
        default=2_000_000,
        help="time the 30-day Overview without the rollup only up to this many events",
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument("--json", action="store_true", help="print JSON (the default anyway)")
    args = parser.parse_args(argv)
    if not args.postgres:
        parser.error("--postgres URL is needed (or $TABLOOP_TEST_POSTGRES_URL)")
    if args.events < 1 or args.runs < 1:
        parser.error("--events and --runs must be at least 1")
    with fresh_database(args.postgres, args.keep) as url:
        result = measure(url, args.events, args.runs, args.seed, args.baseline_30d_max)
    # The URL's password stays out of the result.
    result["command"] = "tabloop bench dashboard " + " ".join(
        "URL" if "://" in a else a for a in argv
    )
    result["postgres"] = _server_version(args.postgres)
    print(json.dumps(result, indent=2))
    return 0


def _server_version(url: str) -> str:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return str(connection.execute(text("SHOW server_version")).scalar())
    finally:
        engine.dispose()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
