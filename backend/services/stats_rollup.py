"""The stats rollup: SQL aggregation of a tenant's events into additive counters.

- `stats_rollup` holds additive counters per tenant, 5-minute bucket of event time, serving
  policy version, model (adapter) version, language and editor. `StatsRollup.refresh()` folds
  new events into it with one `INSERT .. SELECT .. GROUP BY .. ON CONFLICT DO UPDATE SET n = n +
  excluded.n` per event type, from the last event id it counted (`stats_watermarks`) to the
  newest id it may count. Outcomes and retention measurements take the policy and model
  versions, language and editor of their decision (joined on `(tenant_id, decision_id)`); their
  own time places them in a bucket.
- `stats_rollup_hourly` holds the same counters per hour, rebuilt from the 5-minute rows of the
  hours a refresh touched.
- `event_selects()` are the per-type SELECTs of that aggregation; the read side
  (`backend/services/stats.py`) runs them, not inserted, over the events not rolled up yet.

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
    StatsWatermark,
    StoredEvent,
)
from backend.storage import Storage

log = logging.getLogger(__name__)

# Events folded into the rollup per transaction: a refresh after a bulk load commits in steps.
REFRESH_CHUNK = 1_000_000
# Sorting and hashing a chunk of a bulk refresh in memory (PostgreSQL; this transaction only).
REFRESH_WORK_MEM = "128MB"
UNKNOWN = ""

ROLLUP = STATS_ROLLUP
HOURLY = STATS_ROLLUP_HOURLY
KEYS = ("tenant_id", "bucket", "policy_version", "model_version", "language", "client_name")
EVENTS = cast(Table, StoredEvent.__table__)
# The columns of an `event_selects()` row after the tenant: what the read side takes of each.
SOURCE_COLUMNS = (
    "bucket",
    "policy_version",
    "model_version",
    "language",
    "client_name",
    *ROLLUP_COUNTERS,
)


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
        _text(decision, "model_version").label("model_version"),
        _text(decision, "language").label("language"),
        _text(decision, "client_name").label("client_name"),
    ]


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


After = int | ColumnElement[int]
"""An event id, or an expression of one that the reading statement evaluates
(`committed_watermark`)."""


def committed_watermark(tenant_id: int) -> ColumnElement[int]:
    """The tenant's watermark as the statement it is part of sees it (0: none): a read of the
    rollup and of the live tail after this watermark in one statement sees both from the same
    snapshot, so a refresh committed meanwhile by another request neither drops nor doubles
    a range."""
    return (
        select(func.coalesce(func.max(StatsWatermark.last_event_id), 0))
        .where(StatsWatermark.tenant_id == tenant_id)
        .scalar_subquery()
    )


def _id_range(table: Any, tenant_id: int, after: After, upto: int | None) -> list[Any]:
    where = [table.c.tenant_id == tenant_id, table.c.id > after]
    if upto is not None:
        where.append(table.c.id <= upto)
    return where


def _narrow(query: Select[Any]) -> Any:
    # OFFSET 0 keeps PostgreSQL from merging this projection into the aggregate above it: the
    # rows sorted and grouped then hold a few small values, not each event's JSON body.
    return query.offset(0).subquery()


def _decision_select(dialect: str, tenant_id: int, after: After, upto: int | None) -> Select[Any]:
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
    dims = [
        rows.c.bucket,
        rows.c.policy_version,
        rows.c.model_version,
        rows.c.language,
        rows.c.client_name,
    ]
    return select(
        literal(tenant_id, Integer).label("tenant_id"),
        *dims,
        *(values[name].label(name) for name in ROLLUP_COUNTERS),
    ).group_by(*dims)


def _joined_select(
    dialect: str,
    kind: Literal["outcome", "retention"],
    tenant_id: int,
    after: After,
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


def event_selects(
    dialect: str, tenant_id: int, after: After, upto: int | None
) -> list[Select[Any]]:
    """The aggregation of a tenant's events with ids in `(after, upto]` (`upto` None: all
    after), one SELECT per event type."""
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
    dims = [
        ROLLUP.c.policy_version,
        ROLLUP.c.model_version,
        ROLLUP.c.language,
        ROLLUP.c.client_name,
    ]
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


class StatsRollup:
    """Folds one database's events into the rollup, per tenant (thread-safe)."""

    def __init__(self, storage: Storage, *, settle_s: float | None = None) -> None:
        self.storage = storage
        self.dialect = storage.dialect
        self.settle_s = (0.0 if self.dialect == "sqlite" else 5.0) if settle_s is None else settle_s
        self._seen: dict[int, deque[tuple[float, int]]] = {}
        self._lock = threading.Lock()

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
                    for source in event_selects(self.dialect, tenant_id, after, upto):
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
