"""Statistics of the loop per tenant, for the dashboard, `/v1/stats/...` and `tabloop stats`.

Everything is computed by SQL aggregation in the database, on SQLite and PostgreSQL alike. This
module is the read side; the rollup it reads (`stats_rollup`, `stats_rollup_hourly`) is written
by `backend/services/stats_rollup.py`.

A query reads the rollup rows of its window and the events not rolled up yet (the rollup's own
SELECT, not inserted), so an answer includes the events stored a moment ago. A window of 30 days
is at most 8,640 buckets per policy, language and editor; the tail is bounded by refreshing the
rollup before each query.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal, cast

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Select,
    Table,
    func,
    literal_column,
    select,
    union_all,
)

from backend.adapters.registry import transitions_of
from backend.db.models import (
    HOURLY_BUCKET_S,
    LATENCY_BIN_EDGES_MS,
    LATENCY_BINS,
    RETENTION_AFTER_S,
    ROLLUP_BUCKET_S,
    ClientSpool,
    IngestMinute,
)
from backend.policy.registry import PolicyRegistry
from backend.services.stats_rollup import (
    HOURLY,
    KEYS,
    REFRESH_CHUNK,
    ROLLUP,
    ROLLUP_COUNTERS,
    SOURCE_COLUMNS,
    StatsRollup,
    committed_watermark,
    event_selects,
)
from backend.storage import Storage
from backend.sync.models import SyncPlacement, SyncWorkspace
from completion.gate import BUILTIN_VERSION
from telemetry.events import BASE_MODEL_VERSION

# Adapter transitions after which the version they name serves every client (a canary's start
# and an approval leave the band as it is; `canary-rollback` names the version serving again).
MODEL_SERVING_ACTIONS = ("promote", "rollback", "canary-promote", "canary-rollback")

WindowName = Literal["1h", "24h", "7d", "30d"]
# Window -> (seconds, step of the chart in seconds): at most a few hundred points per series.
WINDOWS: dict[str, tuple[int, int]] = {
    "1h": (3_600, 300),
    "24h": (86_400, 900),
    "7d": (7 * 86_400, 3_600),
    "30d": (30 * 86_400, 21_600),
}
DIMENSIONS = {
    "language": "language",
    "editor": "client_name",
    "policy": "policy_version",
    "model": "model_version",
}
MAX_SPLIT_VALUES = 12  # values of a dimension charted; the rest are summed as "(other)"
MAX_LIST_ROWS = 200  # installations, workspaces: the most recent this many
ALL_TIME_END = 2**62 // 3600 * 3600  # "since ever": whole hours, so the hourly rows serve it


def window_bounds(window: str, now: float | None = None) -> tuple[int, int, int]:
    """`(start, end, step)` in Unix seconds for a window name; ValueError for an unknown one.

    `end` is the end of the current bucket of the rollup the window reads (the hour for windows
    in whole hours, which read hourly rows: a bucket is never cut), `start` a whole number of
    steps before it.
    """
    if window not in WINDOWS:
        raise ValueError(f"window must be one of {', '.join(WINDOWS)}")
    length, step = WINDOWS[window]
    now = time.time() if now is None else now
    width = HOURLY_BUCKET_S if _reads_hourly(length, step) else ROLLUP_BUCKET_S
    end = (int(now) // width + 1) * width
    start = (end - length) // step * step
    return start, end, step


def _reads_hourly(length: int, step: int | None) -> bool:
    """Whether a window of `length` seconds in steps of `step` reads the hourly rollup."""
    return length > 86_400 and (step is None or step % HOURLY_BUCKET_S == 0)


def _by_name(columns: Sequence[Any]) -> list[ColumnElement[Any]]:
    # GROUP BY the output names: an expression with bound parameters repeated in GROUP BY is a
    # different expression to PostgreSQL (other parameter numbers), and refused.
    return [literal_column(column.name) for column in columns]


# -- results ------------------------------------------------------------------------------------


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def latency_percentile(bins: Sequence[float], q: float) -> float | None:
    """The `q` quantile (0..1) of a latency histogram, interpolated inside its bin (ms)."""
    total = sum(bins)
    if total <= 0:
        return None
    rank = q * total
    seen = 0.0
    lower = 0.0
    for index, count in enumerate(bins):
        upper = (
            LATENCY_BIN_EDGES_MS[index]
            if index < len(LATENCY_BIN_EDGES_MS)
            else LATENCY_BIN_EDGES_MS[-1] * 2
        )
        if count > 0 and seen + count >= rank:
            return lower + (upper - lower) * (rank - seen) / count
        seen += count
        lower = upper
    return lower


def figures(row: dict[str, float]) -> dict[str, Any]:
    """The rates and totals a dashboard card shows, from summed rollup counters."""
    shown = row["shown"]
    bins = [row[f"latency_bin_{i}"] for i in range(LATENCY_BINS)]
    out: dict[str, Any] = {
        "requests": int(row["requests"]),
        "decisions": int(row["decisions"]),
        "shown": int(shown),
        "silenced": int(row["silenced"]),
        "shown_share": _ratio(shown, row["requests"]),
        "accepted": int(row["accepted"]),
        "partial": int(row["partial"]),
        "ignored": int(row["ignored"]),
        "accept_rate": _ratio(row["accepted"], shown),
        "partial_rate": _ratio(row["partial"], shown),
        "accepted_chars": int(row["accepted_chars"]),
        "silences": {
            "policy": int(row["silence_policy"]),
            "empty": int(row["silence_empty"]),
            "latency": int(row["silence_latency"]),
            "unknown": int(
                row["silenced"]
                - row["silence_policy"]
                - row["silence_empty"]
                - row["silence_latency"]
            ),
        },
        "retained_chars": {str(s): int(row[f"retained_{s}"]) for s in RETENTION_AFTER_S},
        "retained_share": {
            str(s): _ratio(row[f"retained_{s}"], row[f"retention_base_{s}"])
            for s in RETENTION_AFTER_S
        },
        "latency_ms": {
            "p50": latency_percentile(bins, 0.5),
            "p95": latency_percentile(bins, 0.95),
            "mean": _ratio(row["latency_sum_ms"], row["latency_n"]),
        },
    }
    return out


def _empty_row() -> dict[str, float]:
    return dict.fromkeys(ROLLUP_COUNTERS, 0.0)


class StatsService:
    """The figures of one database's events, per tenant, read from the rollup and its live
    tail (thread-safe)."""

    def __init__(self, storage: Storage, registry: PolicyRegistry, rollup: StatsRollup) -> None:
        self.storage = storage
        self.registry = registry
        self.rollup = rollup
        self.dialect = storage.dialect

    def model_history(self, tenant_id: int) -> list[dict[str, Any]]:
        """The tenant's adapter transitions (promotions, canaries, rollbacks), oldest first, as
        `history` entries (`at` an ISO time), from its registry in the database
        (`backend.adapters.registry`); empty without adapters."""
        with self.storage.session() as session:
            transitions = transitions_of(session, tenant_id)
        return [
            {**entry, "at": datetime.fromtimestamp(float(entry["at"]), UTC).isoformat()}
            for entry in transitions
        ]

    def _rows(
        self, tenant_id: int, start: int, end: int, group: Sequence[str], step: int | None
    ) -> list[dict[str, Any]]:
        """Summed counters of a tenant in `[start, end)`, grouped by `group` columns (and by
        `step`-second time slots when `step` is given), from the rollup and the live tail."""
        self.rollup.refresh(tenant_id, max_events=REFRESH_CHUNK)
        # The tail starts at the watermark the query itself sees, not the one this refresh
        # returned: another request's refresh may commit between the two.
        watermark = committed_watermark(tenant_id)
        # Hourly rows when the window and its steps are whole hours (7 and 30 days, all time).
        hourly = _reads_hourly(end - start, step) and start % HOURLY_BUCKET_S == 0
        hourly = hourly and end % HOURLY_BUCKET_S == 0
        table = HOURLY if hourly else ROLLUP
        rolled = select(
            *(table.c[name] for name in KEYS[1:]),
            *(table.c[name] for name in ROLLUP_COUNTERS),
        ).where(table.c.tenant_id == tenant_id, table.c.bucket >= start, table.c.bucket < end)
        parts: list[Select[Any]] = [rolled]
        for source in event_selects(self.dialect, tenant_id, watermark, None):
            sub = source.subquery()
            parts.append(
                select(*(sub.c[name] for name in SOURCE_COLUMNS)).where(
                    sub.c.bucket >= start, sub.c.bucket < end
                )
            )
        union = union_all(*parts).subquery("u")
        keys: list[ColumnElement[Any]] = [union.c[name] for name in group]
        if step is not None:
            slot: ColumnElement[int] = literal_column(str(int(step)), BigInteger)
            keys.insert(0, ((union.c.bucket // slot) * slot).label("t"))
        query = select(*keys, *(func.sum(union.c[name]).label(name) for name in ROLLUP_COUNTERS))
        if keys:
            names = _by_name(keys)
            query = query.group_by(*names).order_by(*names)
        with self.storage.engine.connect() as connection:
            result = connection.execute(query).mappings().all()
        return [
            {key: (float(value or 0) if key in _COUNTER_SET else value) for key, value in r.items()}
            for r in result
        ]

    def overview(self, tenant_id: int, window: str, *, now: float | None = None) -> dict[str, Any]:
        """The Overview page: totals of the window, time series, policy bands and markers."""
        start, end, step = window_bounds(window, now)
        slots = self._rows(tenant_id, start, end, (), step)
        total = _empty_row()
        for slot in slots:
            for name in ROLLUP_COUNTERS:
                total[name] += slot[name]
        series = _series(slots, start, end, step)
        history = self.registry.history(tenant_id)
        models = self.model_history(tenant_id)
        model_bands = policy_bands(
            models, start, end, initial=BASE_MODEL_VERSION, actions=MODEL_SERVING_ACTIONS
        )
        return {
            "window": window,
            "start": start,
            "end": end,
            "step": step,
            "summary": figures(total),
            "series": series,
            "bands": policy_bands(history, start, end),
            "markers": [m for m in _markers(history) if start <= m["t"] < end],
            "serving": self.registry.serving_version(tenant_id),
            "model_bands": model_bands,
            "model_markers": [m for m in _markers(models) if start <= m["t"] < end],
            "model_serving": model_bands[-1]["version"] if model_bands else BASE_MODEL_VERSION,
            "empty": total["decisions"] == 0 and total["outcomes"] == 0,
        }

    def split(
        self, tenant_id: int, window: str, by: str, *, now: float | None = None
    ) -> dict[str, Any]:
        """The same figures split by language, editor, policy version or model (adapter)
        version, with time series of the accept and shown rates of the busiest values."""
        if by not in DIMENSIONS:
            raise ValueError(f"split by one of {', '.join(DIMENSIONS)}")
        column = DIMENSIONS[by]
        start, end, step = window_bounds(window, now)
        totals = self._rows(tenant_id, start, end, (column,), None)
        totals.sort(key=lambda r: (-r["requests"], -r["outcomes"], str(r[column])))
        charted = [str(r[column]) for r in totals[:MAX_SPLIT_VALUES]]
        rows = [{"value": str(r[column]) or "(unknown)", **figures(r)} for r in totals]
        slots = self._rows(tenant_id, start, end, (column,), step)
        times = list(range(start, end, step))
        index = {t: i for i, t in enumerate(times)}
        accept: dict[str, list[float | None]] = {v: [None] * len(times) for v in charted}
        shown: dict[str, list[float | None]] = {v: [None] * len(times) for v in charted}
        for slot in slots:
            value = str(slot[column])
            i = index.get(int(slot["t"]))
            if value in accept and i is not None:
                accept[value][i] = _ratio(slot["accepted"], slot["shown"])
                shown[value][i] = _ratio(slot["shown"], slot["requests"])
        return {
            "window": window,
            "by": by,
            "start": start,
            "end": end,
            "step": step,
            "rows": rows[:MAX_LIST_ROWS],
            "series": {
                "t": times,
                "values": [v or "(unknown)" for v in charted],
                "accept_rate": [accept[v] for v in charted],
                "shown_share": [shown[v] for v in charted],
            },
            "empty": not totals,
        }

    def policies(self, tenant_id: int, *, confidence_z: float = 1.645) -> dict[str, Any]:
        """Every version with its off-policy evaluation and live figures since it served."""
        history = [
            {**entry, "at": _iso_text(entry["at"])} for entry in self.registry.history(tenant_id)
        ]
        first_served: dict[str, int] = {}
        for entry in history:
            first_served.setdefault(entry["version"], _epoch(entry["at"]))
        live = {
            str(r["policy_version"]): r
            for r in self._rows(tenant_id, 0, ALL_TIME_END, ("policy_version",), None)
        }
        versions = []
        for record in self.registry.versions(tenant_id):
            report = record.report
            candidate = report.get("candidate", {}) if isinstance(report, dict) else {}
            gain, stderr = report.get("gain"), report.get("gain_stderr")
            bound = (
                gain - confidence_z * stderr if gain is not None and stderr is not None else None
            )
            row = live.get(record.version)
            versions.append(
                {
                    **record.as_json(),
                    "created_at": _iso(record.created_at),
                    "evaluation": {
                        "dr": candidate.get("dr", {}).get("value"),
                        "dr_stderr": candidate.get("dr", {}).get("stderr"),
                        "snips": candidate.get("snips", {}).get("value"),
                        "ess": candidate.get("dr", {}).get("ess"),
                        "shown_rate": candidate.get("shown_rate"),
                        "gain": gain,
                        "gain_stderr": stderr,
                        "gain_lower_bound": bound,
                        "serving_dr": report.get("serving", {}).get("dr", {}).get("value"),
                        "holdout_events": report.get("holdout_events"),
                    },
                    "first_served": first_served.get(record.version),
                    "live": figures(row) if row is not None else None,
                }
            )
        builtin = live.get(BUILTIN_VERSION)
        return {
            "serving": self.registry.serving_version(tenant_id),
            "versions": versions,
            "builtin_live": figures(builtin) if builtin is not None else None,
            "history": history,
            "confidence_z": confidence_z,
        }

    def ingestion(self, tenant_id: int, window: str, *, now: float | None = None) -> dict[str, Any]:
        """Batches per minute and their fate, rate-limited requests, client spools, sync."""
        start, end, step = window_bounds(window, now)
        minute_step = max(60, step)
        m = cast(Table, IngestMinute.__table__)
        counters = [
            "batches",
            "events",
            "accepted",
            "duplicate",
            "rejected_events",
            "refused_batches",
            "duplicate_batches",
            "rate_limited",
        ]
        width: ColumnElement[int] = literal_column(str(int(minute_step)), BigInteger)
        slot = ((m.c.minute // width) * width).label("t")
        query = (
            select(slot, *(func.sum(m.c[c]).label(c) for c in counters))
            .where(m.c.tenant_id == tenant_id, m.c.minute >= start, m.c.minute < end)
            .group_by(literal_column("t"))
            .order_by(literal_column("t"))
        )
        spools = (
            select(ClientSpool.install_id, ClientSpool.backlog, ClientSpool.dropped)
            .add_columns(ClientSpool.reported_at)
            .where(ClientSpool.tenant_id == tenant_id)
            .order_by(ClientSpool.reported_at.desc())
            .limit(MAX_LIST_ROWS)
        )
        chunks = (
            select(SyncPlacement.workspace_id, func.count().label("chunks"))
            .where(SyncPlacement.tenant_id == tenant_id)
            .group_by(SyncPlacement.workspace_id)
            .subquery()
        )
        workspaces = (
            select(
                SyncWorkspace.workspace,
                SyncWorkspace.model,
                SyncWorkspace.updated_at,
                func.coalesce(chunks.c.chunks, 0),
            )
            .outerjoin(chunks, chunks.c.workspace_id == SyncWorkspace.id)
            .where(SyncWorkspace.tenant_id == tenant_id)
            .order_by(SyncWorkspace.updated_at.desc())
            .limit(MAX_LIST_ROWS)
        )
        with self.storage.engine.connect() as connection:
            rows = connection.execute(query).mappings().all()
            spool_rows = connection.execute(spools).all()
            workspace_rows = connection.execute(workspaces).all()
        times = list(range(start - start % minute_step, end, minute_step))
        index = {t: i for i, t in enumerate(times)}
        series: dict[str, list[float]] = {c: [0.0] * len(times) for c in counters}
        totals = dict.fromkeys(counters, 0)
        for row in rows:
            i = index.get(int(row["t"]))
            for c in counters:
                value = int(row[c] or 0)
                totals[c] += value
                if i is not None:
                    series[c][i] = float(value)
        events_per_s = [value / minute_step for value in series["accepted"]]
        return {
            "window": window,
            "start": start,
            "end": end,
            "step": minute_step,
            "totals": {**totals, "events_per_s": totals["accepted"] / (end - start)},
            "series": {"t": times, "events_per_s": events_per_s, **series},
            "spools": [
                {
                    "install_id": r[0],
                    "backlog": int(r[1]),
                    "dropped": int(r[2]),
                    "reported_at": _iso(r[3]),
                }
                for r in spool_rows
            ],
            "workspaces": [
                {
                    "workspace": r[0],
                    "model": r[1],
                    "last_sync": _iso(r[2]),
                    "chunks": int(r[3]),
                }
                for r in workspace_rows
            ],
            "empty": totals["batches"] == 0 and not spool_rows and not workspace_rows,
        }


_COUNTER_SET = frozenset(ROLLUP_COUNTERS)


def _iso(value: datetime) -> str:
    if value.tzinfo is None:  # SQLite gives back the UTC wall time
        value = value.replace(tzinfo=UTC)
    return value.isoformat()


def _iso_text(text: str) -> str:
    """An ISO time with its offset (SQLite gives back UTC wall times without one)."""
    return _iso(datetime.fromisoformat(text))


def _epoch(text: str) -> int:
    value = datetime.fromisoformat(text)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return int(value.timestamp())


def _series(slots: list[dict[str, Any]], start: int, end: int, step: int) -> dict[str, Any]:
    """Columns of the Overview charts: one entry per step, None where nothing happened."""
    times = list(range(start, end, step))
    index = {t: i for i, t in enumerate(times)}
    names = [
        "requests",
        "shown_share",
        "accept_rate",
        "partial_rate",
        "accepted_chars",
        "retained_30",
        "retained_120",
        "retained_600",
        "silence_policy",
        "silence_empty",
        "silence_latency",
        "silence_unknown",
        "latency_p50",
        "latency_p95",
    ]
    columns: dict[str, list[float | None]] = {name: [None] * len(times) for name in names}
    for slot in slots:
        i = index.get(int(slot["t"]))
        if i is None:
            continue
        f = figures(slot)
        values: dict[str, float | None] = {
            "requests": f["requests"],
            "shown_share": f["shown_share"],
            "accept_rate": f["accept_rate"],
            "partial_rate": f["partial_rate"],
            "accepted_chars": f["accepted_chars"],
            "retained_30": f["retained_chars"]["30"],
            "retained_120": f["retained_chars"]["120"],
            "retained_600": f["retained_chars"]["600"],
            "silence_policy": f["silences"]["policy"],
            "silence_empty": f["silences"]["empty"],
            "silence_latency": f["silences"]["latency"],
            "silence_unknown": f["silences"]["unknown"],
            "latency_p50": f["latency_ms"]["p50"],
            "latency_p95": f["latency_ms"]["p95"],
        }
        for name in names:
            columns[name][i] = values[name]
    return {"t": times, **columns}


def _markers(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "t": _epoch(entry["at"]),
            "action": entry["action"],
            "version": entry["version"],
            "actor": entry.get("actor"),
            "reason": entry.get("reason"),
        }
        for entry in history
    ]


def policy_bands(
    history: list[dict[str, Any]],
    start: int,
    end: int,
    *,
    initial: str = BUILTIN_VERSION,
    actions: tuple[str, ...] = ("promote", "rollback"),
) -> list[dict[str, Any]]:
    """The serving version over `[start, end)`: one band per stretch, from the history (the
    built-in policy, or `initial`, before the first entry). Entries whose action is one of
    `actions` name the version serving from then on."""
    bands: list[dict[str, Any]] = []
    version, since = initial, start
    for entry in history:
        at = _epoch(entry["at"])
        if at >= end:
            break
        # Actions that do not change the serving version (a canary's start, an approval) keep
        # the band; the registry's history names the serving version on promote and rollback.
        if entry["action"] not in actions:
            continue
        if at > start and entry["version"] != version:
            bands.append({"version": version, "start": max(since, start), "end": at})
        if entry["version"] != version:
            version, since = entry["version"], max(at, start)
    bands.append({"version": version, "start": max(since, start), "end": end})
    return [b for b in bands if b["end"] > b["start"]]
