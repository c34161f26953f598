"""Statistics of the loop per tenant, for the dashboard, `/v1/stats/...` and `tabloop stats`.

Everything is computed by SQL aggregation in the database, on SQLite and PostgreSQL alike:

- `stats_rollup` holds additive counters per tenant, 5-minute bucket of event time, serving
  policy version, language and editor. `refresh()` folds new events into it with one
  `INSERT .. SELECT .. GROUP BY .. ON CONFLICT DO UPDATE SET n = n + excluded.n` per event type,
  from the last event id it counted (`stats_watermarks`) to the newest id it may count. Outcomes
  and retention measurements take the policy version, language and editor of their decision
  (joined on `(tenant_id, decision_id)`); their own time places them in a bucket.
- A query reads the rollup rows of its window and the events not rolled up yet (the same SELECT,
  not inserted), so an answer includes the events stored a moment ago. A window of 30 days is
  at most 8,640 buckets per policy, language and editor; the tail is bounded by refreshing
  before each query.

On PostgreSQL, transactions of concurrent writers commit out of id order, so an id seen now may
be overtaken by a smaller one committed later: `refresh()` counts only ids it saw at least
`settle_s` seconds ago (the newer ones stay in the live tail). SQLite commits one writer at a
time, in id order, so it counts everything at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, cast

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Integer,
    Select,
    Table,
    and_,
    case,
    func,
    literal,
    literal_column,
    select,
    union_all,
    update,
)
from sqlalchemy import (
    cast as sql_cast,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import OperationalError

from backend.db.models import (
    HOURLY_BUCKET_S,
    LATENCY_BIN_EDGES_MS,
    LATENCY_BINS,
    RETENTION_AFTER_S,
    ROLLUP_BUCKET_S,
    ROLLUP_COUNTERS,
    STATS_ROLLUP,
    STATS_ROLLUP_HOURLY,
    ClientSpool,
    IngestMinute,
    StatsWatermark,
    StoredEvent,
)
from backend.policy.registry import PolicyRegistry
from backend.storage import Storage
from backend.sync.models import SyncPlacement, SyncWorkspace
from completion.gate import BUILTIN_VERSION

log = logging.getLogger(__name__)

WindowName = Literal["1h", "24h", "7d", "30d"]
# Window -> (seconds, step of the chart in seconds): at most a few hundred points per series.
WINDOWS: dict[str, tuple[int, int]] = {
    "1h": (3_600, 300),
    "24h": (86_400, 900),
    "7d": (7 * 86_400, 3_600),
    "30d": (30 * 86_400, 21_600),
}
DIMENSIONS = {"language": "language", "editor": "client_name", "policy": "policy_version"}
MAX_SPLIT_VALUES = 12  # values of a dimension charted; the rest are summed as "(other)"
MAX_LIST_ROWS = 200  # installations, workspaces: the most recent this many
# Events folded into the rollup per transaction: a refresh after a bulk load commits in steps.
REFRESH_CHUNK = 1_000_000
# Sorting and hashing a chunk of a bulk refresh in memory (PostgreSQL; this transaction only).
REFRESH_WORK_MEM = "128MB"
UNKNOWN = ""
ALL_TIME_END = 2**62 // 3600 * 3600  # "since ever": whole hours, so the hourly rows serve it

ROLLUP = STATS_ROLLUP
HOURLY = STATS_ROLLUP_HOURLY
KEYS = ("tenant_id", "bucket", "policy_version", "language", "client_name")
EVENTS = cast(Table, StoredEvent.__table__)


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


# -- SQL building blocks ------------------------------------------------------------------------


def _bucket(dialect: str, column: Any) -> ColumnElement[int]:
    """The start of the 5-minute bucket holding a timestamp column, in Unix seconds."""
    width: ColumnElement[int] = literal_column(str(ROLLUP_BUCKET_S), BigInteger)
    epoch: ColumnElement[int]
    if dialect == "postgresql":
        epoch = sql_cast(func.floor(func.extract("epoch", column) / width), BigInteger)
    else:  # SQLite stores the UTC wall time as text: strftime('%s') reads it as UTC
        epoch = sql_cast(func.strftime(literal_column("'%s'"), column), Integer) // width
    return epoch * width


def _text(table: Any, key: str) -> ColumnElement[str]:
    return func.coalesce(table.c.body[key].as_string(), UNKNOWN)


def _count(condition: ColumnElement[bool]) -> ColumnElement[int]:
    return func.sum(case((condition, 1), else_=0))


def _sum(condition: ColumnElement[bool], value: ColumnElement[Any]) -> ColumnElement[int]:
    return func.sum(case((condition, value), else_=0))


def _zero() -> ColumnElement[int]:
    return literal(0, BigInteger)


def _dimensions(dialect: str, time_of: Any, decision: Any) -> list[ColumnElement[Any]]:
    return [
        _bucket(dialect, time_of.c.time).label("bucket"),
        _text(decision, "policy_version").label("policy_version"),
        _text(decision, "language").label("language"),
        _text(decision, "client_name").label("client_name"),
    ]


def _by_name(columns: Sequence[Any]) -> list[ColumnElement[Any]]:
    # GROUP BY the output names: an expression with bound parameters repeated in GROUP BY is a
    # different expression to PostgreSQL (other parameter numbers), and refused.
    return [literal_column(column.name) for column in columns]


def _latency_bins(first: ColumnElement[bool], ms: ColumnElement[float]) -> dict[str, Any]:
    bins: dict[str, Any] = {}
    lower: float | None = None
    for index in range(LATENCY_BINS):
        upper = LATENCY_BIN_EDGES_MS[index] if index < len(LATENCY_BIN_EDGES_MS) else None
        parts = [first]
        if lower is not None:
            parts.append(ms >= lower)
        if upper is not None:
            parts.append(ms < upper)
        bins[f"latency_bin_{index}"] = _count(and_(*parts))
        lower = upper
    return bins


def _id_range(table: Any, tenant_id: int, after: int, upto: int | None) -> list[Any]:
    where = [table.c.tenant_id == tenant_id, table.c.id > after]
    if upto is not None:
        where.append(table.c.id <= upto)
    return where


def _narrow(query: Select[Any]) -> Any:
    # OFFSET 0 keeps PostgreSQL from merging this projection into the aggregate above it: the
    # rows sorted and grouped then hold a few small values, not each event's JSON body.
    return query.offset(0).subquery()


def _decision_select(dialect: str, tenant_id: int, after: int, upto: int | None) -> Select[Any]:
    d = EVENTS
    rows = _narrow(
        select(
            *_dimensions(dialect, d, d),
            case((func.coalesce(d.c.body["rank"].as_integer(), 0) == 0, 1), else_=0).label("first"),
            d.c.label.label("action"),
            d.c.body["silence_reason"].as_string().label("reason"),
            func.coalesce(d.c.body[("latency", "total_ms")].as_float(), 0.0).label("ms"),
        ).where(*_id_range(d, tenant_id, after, upto), d.c.type == "decision")
    )
    first = rows.c.first == 1
    show, silence = rows.c.action == "show", rows.c.action == "silence"
    values: dict[str, Any] = {name: _zero() for name in ROLLUP_COUNTERS}
    values.update(
        requests=_count(first),
        decisions=func.count(),
        shown=_count(and_(first, show)),
        silenced=_count(and_(first, silence)),
        silence_policy=_count(and_(first, silence, rows.c.reason == "policy")),
        silence_empty=_count(and_(first, silence, rows.c.reason == "empty")),
        silence_latency=_count(and_(first, silence, rows.c.reason == "latency")),
        latency_n=_count(first),
        latency_sum_ms=_sum(first, sql_cast(rows.c.ms, BigInteger)),
        **_latency_bins(first, rows.c.ms),
    )
    return _grouped(tenant_id, rows, values)


def _grouped(tenant_id: int, rows: Any, values: dict[str, Any]) -> Select[Any]:
    dims = [rows.c.bucket, rows.c.policy_version, rows.c.language, rows.c.client_name]
    return select(
        literal(tenant_id, Integer).label("tenant_id"),
        *dims,
        *(values[name].label(name) for name in ROLLUP_COUNTERS),
    ).group_by(*dims)


def _joined_select(
    dialect: str,
    kind: Literal["outcome", "retention"],
    tenant_id: int,
    after: int,
    upto: int | None,
) -> Select[Any]:
    """Outcomes or retention measurements, with the dimensions of their decision."""
    e = EVENTS.alias("e")
    d = EVENTS.alias("d")
    rows = _narrow(
        select(
            *_dimensions(dialect, e, d),
            e.c.label.label("kind"),
            func.coalesce(e.c.body["accepted_chars"].as_integer(), 0).label("accepted_chars"),
            func.coalesce(e.c.body["retained_chars"].as_integer(), 0).label("retained_chars"),
        )
        .select_from(
            e.outerjoin(
                d,
                and_(
                    d.c.tenant_id == e.c.tenant_id,
                    d.c.decision_id == e.c.decision_id,
                    d.c.type == "decision",
                ),
            )
        )
        .where(*_id_range(e, tenant_id, after, upto), e.c.type == kind)
    )
    values: dict[str, Any] = {name: _zero() for name in ROLLUP_COUNTERS}
    if kind == "outcome":
        took = rows.c.kind.in_(("accepted", "partial"))
        values.update(
            accepted=_count(rows.c.kind == "accepted"),
            partial=_count(rows.c.kind == "partial"),
            ignored=_count(rows.c.kind == "ignored"),
            dismissed=_count(rows.c.kind == "dismissed"),
            outcomes=func.count(),
            accepted_chars=_sum(took, rows.c.accepted_chars),
        )
    else:
        for after_s in RETENTION_AFTER_S:
            at = rows.c.kind == str(after_s)
            values[f"retention_base_{after_s}"] = _sum(at, rows.c.accepted_chars)
            values[f"retained_{after_s}"] = _sum(at, rows.c.retained_chars)
    return _grouped(tenant_id, rows, values)


def _event_selects(dialect: str, tenant_id: int, after: int, upto: int | None) -> list[Select[Any]]:
    return [
        _decision_select(dialect, tenant_id, after, upto),
        _joined_select(dialect, "outcome", tenant_id, after, upto),
        _joined_select(dialect, "retention", tenant_id, after, upto),
    ]


def _upsert(dialect: str, source: Select[Any]) -> Any:
    make = postgresql.insert if dialect == "postgresql" else sqlite.insert
    statement = make(ROLLUP).from_select([*KEYS, *ROLLUP_COUNTERS], source)
    return statement.on_conflict_do_update(
        index_elements=list(KEYS),
        set_={name: ROLLUP.c[name] + statement.excluded[name] for name in ROLLUP_COUNTERS},
    )


def _rebuild_hours(connection: Connection, tenant_id: int, first: int, last: int) -> None:
    """Make the hourly rows of hours `[first, last]` (Unix seconds of their starts) the sums of
    their 5-minute rows again: exact whatever was added, and idempotent."""
    connection.execute(
        HOURLY.delete().where(
            HOURLY.c.tenant_id == tenant_id, HOURLY.c.bucket >= first, HOURLY.c.bucket <= last
        )
    )
    width: ColumnElement[int] = literal_column(str(HOURLY_BUCKET_S), BigInteger)
    hour = ((ROLLUP.c.bucket // width) * width).label("hour")  # not "bucket": a column's name
    dims = [ROLLUP.c.policy_version, ROLLUP.c.language, ROLLUP.c.client_name]
    source = (
        select(
            ROLLUP.c.tenant_id,
            hour,
            *dims,
            *(func.sum(ROLLUP.c[name]).label(name) for name in ROLLUP_COUNTERS),
        )
        .where(
            ROLLUP.c.tenant_id == tenant_id,
            ROLLUP.c.bucket >= first,
            ROLLUP.c.bucket < last + HOURLY_BUCKET_S,
        )
        .group_by(ROLLUP.c.tenant_id, literal_column("hour"), *dims)
    )
    connection.execute(HOURLY.insert().from_select([*KEYS, *ROLLUP_COUNTERS], source))


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


@dataclass
class _Seen:
    """Newest event ids seen per tenant, with when (for the PostgreSQL settling delay)."""

    marks: deque[tuple[float, int]]


class StatsService:
    """Aggregates of one database's events, per tenant (thread-safe)."""

    def __init__(
        self, storage: Storage, registry: PolicyRegistry, *, settle_s: float | None = None
    ) -> None:
        self.storage = storage
        self.registry = registry
        self.dialect = storage.dialect
        self.settle_s = (0.0 if self.dialect == "sqlite" else 5.0) if settle_s is None else settle_s
        self._seen: dict[int, deque[tuple[float, int]]] = {}
        self._lock = threading.Lock()

    # -- the rollup ---------------------------------------------------------------------------

    def _newest_id(self, connection: Connection, tenant_id: int) -> int:
        # Per type: each is one step down the (tenant_id, type, id) index.
        newest = 0
        for kind in ("decision", "outcome", "retention"):
            found = connection.execute(
                select(func.max(EVENTS.c.id)).where(
                    EVENTS.c.tenant_id == tenant_id, EVENTS.c.type == kind
                )
            ).scalar()
            newest = max(newest, int(found or 0))
        return newest

    def _settled_id(self, tenant_id: int, newest: int) -> int:
        """The newest id that may be counted now: seen `settle_s` ago (or now, without delay)."""
        if self.settle_s <= 0:
            return newest
        now = time.monotonic()
        with self._lock:
            marks = self._seen.setdefault(tenant_id, deque(maxlen=64))
            if not marks or marks[-1][1] != newest:
                marks.append((now, newest))
            settled = 0
            for seen_at, seen_id in marks:
                if now - seen_at >= self.settle_s:
                    settled = max(settled, seen_id)
            while len(marks) > 1 and now - marks[1][0] >= self.settle_s:
                marks.popleft()
        return settled

    def watermark(self, tenant_id: int) -> int:
        """The last event id counted in the rollup of a tenant (0: none)."""
        with self.storage.engine.connect() as connection:
            found = connection.execute(
                select(StatsWatermark.last_event_id).where(StatsWatermark.tenant_id == tenant_id)
            ).scalar()
        return int(found or 0)

    def refresh(self, tenant_id: int, *, max_events: int | None = None) -> int:
        """Fold a tenant's settled events into the rollup; returns the watermark after.

        Each step covers at most `REFRESH_CHUNK` ids in one transaction that first moves the
        watermark conditionally (`WHERE last_event_id = the value read`): of two processes
        refreshing at once, one counts the range and the other finds the watermark moved and
        counts nothing.
        """
        engine = self.storage.engine
        with engine.connect() as connection:
            target = self._settled_id(tenant_id, self._newest_id(connection, tenant_id))
        start = after = self.watermark(tenant_id)
        if target <= after:
            return after
        if after == 0:
            self._ensure_watermark(tenant_id)
        while after < target:
            if max_events is not None and after - start >= max_events:
                break
            upto = min(target, after + REFRESH_CHUNK)
            try:
                with engine.begin() as connection:
                    if self.dialect == "postgresql":
                        connection.exec_driver_sql(f"SET LOCAL work_mem = '{REFRESH_WORK_MEM}'")
                    moved = connection.execute(
                        update(StatsWatermark)
                        .where(
                            StatsWatermark.tenant_id == tenant_id,
                            StatsWatermark.last_event_id == after,
                        )
                        .values(last_event_id=upto)
                    ).rowcount
                    if moved != 1:
                        connection.rollback()
                        return self.watermark(tenant_id)  # another process counted this range
                    for source in _event_selects(self.dialect, tenant_id, after, upto):
                        connection.execute(_upsert(self.dialect, source))
                    hours = self._hours_of(connection, tenant_id, after, upto)
                    if hours is not None:
                        _rebuild_hours(connection, tenant_id, *hours)
            except OperationalError as exc:  # SQLite: another writer got there first
                log.debug("stats refresh of tenant %d deferred: %s", tenant_id, exc)
                return self.watermark(tenant_id)
            after = upto
        return after

    def _hours_of(
        self, connection: Connection, tenant_id: int, after: int, upto: int
    ) -> tuple[int, int] | None:
        """The first and last hour (Unix seconds) holding events of ids `(after, upto]`."""
        bucket = _bucket(self.dialect, EVENTS.c.time)
        found = connection.execute(
            select(func.min(bucket), func.max(bucket)).where(
                *_id_range(EVENTS, tenant_id, after, upto)
            )
        ).first()
        if found is None or found[0] is None:
            return None
        first, last = int(found[0]), int(found[1])
        return first - first % HOURLY_BUCKET_S, last - last % HOURLY_BUCKET_S

    def _ensure_watermark(self, tenant_id: int) -> None:
        make = postgresql.insert if self.dialect == "postgresql" else sqlite.insert
        with self.storage.engine.begin() as connection:
            connection.execute(
                make(StatsWatermark)
                .values(tenant_id=tenant_id, last_event_id=0)
                .on_conflict_do_nothing(index_elements=["tenant_id"])
            )

    # -- reading --------------------------------------------------------------------------------

    def _rows(
        self, tenant_id: int, start: int, end: int, group: Sequence[str], step: int | None
    ) -> list[dict[str, Any]]:
        """Summed counters of a tenant in `[start, end)`, grouped by `group` columns (and by
        `step`-second time slots when `step` is given), from the rollup and the live tail."""
        watermark = self.refresh(tenant_id, max_events=REFRESH_CHUNK)
        # Hourly rows when the window and its steps are whole hours (7 and 30 days, all time).
        hourly = _reads_hourly(end - start, step) and start % HOURLY_BUCKET_S == 0
        hourly = hourly and end % HOURLY_BUCKET_S == 0
        table = HOURLY if hourly else ROLLUP
        rolled = select(
            *(table.c[name] for name in KEYS[1:]),
            *(table.c[name] for name in ROLLUP_COUNTERS),
        ).where(table.c.tenant_id == tenant_id, table.c.bucket >= start, table.c.bucket < end)
        parts: list[Select[Any]] = [rolled]
        for source in _event_selects(self.dialect, tenant_id, watermark, None):
            sub = source.subquery()
            parts.append(
                select(*(sub.c[name] for name in _SOURCE_COLUMNS)).where(
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
            "empty": total["decisions"] == 0 and total["outcomes"] == 0,
        }

    def split(
        self, tenant_id: int, window: str, by: str, *, now: float | None = None
    ) -> dict[str, Any]:
        """The same figures split by language, editor or policy version, with time series of
        the accept and shown rates of the busiest values."""
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


_SOURCE_COLUMNS = ("bucket", "policy_version", "language", "client_name", *ROLLUP_COUNTERS)
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


def policy_bands(history: list[dict[str, Any]], start: int, end: int) -> list[dict[str, Any]]:
    """The serving version over `[start, end)`: one band per stretch, from the history (the
    built-in policy before the first entry)."""
    bands: list[dict[str, Any]] = []
    version, since = BUILTIN_VERSION, start
    for entry in history:
        at = _epoch(entry["at"])
        if at >= end:
            break
        # Actions that do not change the serving version (a canary's start, an approval) keep
        # the band; the registry's history names the serving version on promote and rollback.
        if entry["action"] not in ("promote", "rollback"):
            continue
        if at > start and entry["version"] != version:
            bands.append({"version": version, "start": max(since, start), "end": at})
        if entry["version"] != version:
            version, since = entry["version"], max(at, start)
    bands.append({"version": version, "start": max(since, start), "end": end})
    return [b for b in bands if b["end"] > b["start"]]
