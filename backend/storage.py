"""Storage of the backend through SQLAlchemy: SQLite by default, PostgreSQL by URL.

Every query takes the tenant id; nothing here reads or writes across tenants. Ingestion is
idempotent on `(tenant_id, event_id)`: a unique constraint plus `INSERT .. ON CONFLICT DO
NOTHING .. RETURNING`, which both databases support, so a replayed event is stored once and the
answer tells which events were new.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from backend.db.migrate import upgrade
from backend.db.models import ApiToken, StoredEvent, Tenant
from backend.group_commit import GroupCommitter
from common.paths import user_data_dir
from telemetry.events import AnyEvent, DecisionEvent, NextEditEvent, OutcomeEvent

TOKEN_PREFIX = "tl_"
TOKEN_CACHE_S = 10.0
TOKEN_CACHE_MAX = 10_000
# Rows per INSERT statement: 8 parameters each stays far below both databases' limits (SQLite
# 32,766, PostgreSQL 65,535) for batches of up to 1,000 events.
INSERT_CHUNK_ROWS = 500
Row = tuple[Any, ...]  # the values of one events row, in `_insert_sql`'s column order
# How events reach PostgreSQL: "array" (default) sends a batch as one JSON array parameter that
# the server unpacks (`jsonb_array_elements`); "rows" is the earlier multi-row VALUES statement
# with 8 parameters per event, kept as the baseline of `tabloop bench scale`.
PG_INGEST_PATHS = ("array", "rows")
# One statement of fixed text per batch, whatever its size: psycopg parses and prepares it once
# per connection. The columns the indexes need are taken out of the JSON by the server.
_PG_ARRAY_INSERT = (
    "INSERT INTO events (tenant_id, event_id, type, decision_id, label, time, received_at, body) "
    "SELECT %s, e->>'event_id', e->>'type', e->>'decision_id', "
    "CASE e->>'type' WHEN 'decision' THEN e->>'action' WHEN 'outcome' THEN e->>'kind' "
    "WHEN 'next_edit' THEN e->>'kind' "
    "ELSE e->>'after_s' END, (e->>'time')::timestamptz, %s, e "
    "FROM jsonb_array_elements(%s::jsonb) AS e "
    "ON CONFLICT (tenant_id, event_id) DO NOTHING RETURNING event_id"
)


@dataclass(frozen=True)
class ArrayBatch:
    """One batch for the "array" path: the tenant, the arrival time and the events' JSON texts
    joined into one JSON array."""

    tenant_id: int
    received_at: datetime
    events_json: str


def default_db_url() -> str:
    """A SQLite file in the platform's data directory (`common.paths.user_data_dir`)."""
    path = user_data_dir() / "backend.sqlite3"
    return f"sqlite:///{path}"


def tenant_name_problem(name: str) -> str | None:
    """Why `name` cannot name a new tenant, or None.

    A name is printed in logs, metrics labels and command lines, and typed back to select the
    tenant: whitespace, control and invisible (format) characters would make two names look the
    same, or split a log line, so they are refused.
    """
    if not name or len(name) > 128:
        return "a tenant name is 1 to 128 characters"
    for char in name:
        category = unicodedata.category(char)
        # C*: control, format, surrogate, private use, unassigned; Z*: every kind of space.
        if char.isspace() or category[0] in ("C", "Z"):
            return f"a tenant name has no whitespace or control characters (found {char!r})"
    return None


def token_label_problem(label: str) -> str | None:
    """Why `label` cannot label a token, or None (the same rule as tenant names, 64 chars)."""
    if not label or len(label) > 64:
        return "a token label is 1 to 64 characters"
    problem = tenant_name_problem(label)
    return problem.replace("tenant name", "token label") if problem else None


def hash_token(token: str) -> str:
    """SHA-256 of a token; tokens are 256-bit random, so a fast hash is enough."""
    return hashlib.sha256(token.encode()).hexdigest()


class SerializedJson(str):
    """JSON text already made (by pydantic); stored as is instead of being encoded again."""


def _json_serializer(value: Any) -> str:
    if isinstance(value, SerializedJson):
        return str(value)
    return json.dumps(value)


def make_engine(url: str, *, ping: bool = True, pool_size: int = 8) -> Engine:
    """An engine for `url`, with SQLite set up for durable concurrent use.

    `ping` (PostgreSQL): test each pooled connection with a round trip before using it.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(
            url,
            pool_pre_ping=ping,
            pool_size=pool_size,
            max_overflow=pool_size,
            json_serializer=_json_serializer,
        )
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url,
        connect_args={"timeout": 30, "check_same_thread": False},
        json_serializer=_json_serializer,
    )

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode = WAL")
        # FULL: an event we acknowledged leaves the client's spool, so it must survive power loss.
        cursor.execute("PRAGMA synchronous = FULL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA busy_timeout = 30000")
        cursor.close()

    return engine


@dataclass(frozen=True)
class Principal:
    """Who a request acts for: the token's tenant, its label, and whether it is an admin's
    (which reads and acts on every tenant)."""

    tenant_id: int
    tenant: str
    label: str | None = None
    admin: bool = False
    token_id: int | None = None

    @property
    def actor(self) -> str:
        """How the history names this token's holder: its label, else its tenant, and the
        token's id, since labels are not unique (another tenant's token may carry an admin's
        label): `token:alice#12`, `token#13@acme`."""
        token = "" if self.token_id is None else f"#{self.token_id}"
        return f"token:{self.label}{token}" if self.label else f"token{token}@{self.tenant}"


class Storage:
    """The backend's database."""

    def __init__(self, url: str, *, migrate: bool = True, pg_ingest: str = "array") -> None:
        if pg_ingest not in PG_INGEST_PATHS:
            raise ValueError(f"pg_ingest must be one of {PG_INGEST_PATHS}, not {pg_ingest!r}")
        self.url = url
        self.engine = make_engine(url)
        self.dialect = self.engine.dialect.name
        self.pg_ingest = pg_ingest
        if migrate:
            upgrade(self.engine)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._principals: dict[str, tuple[Principal, float]] = {}
        self._insert_sql_cache: dict[int, str] = {}
        array = self.dialect == "postgresql" and pg_ingest == "array"
        # Ingestion's own pool on PostgreSQL, without the ping round trip before each commit: a
        # connection the server dropped fails that commit (503, which the client retries) and
        # SQLAlchemy replaces the pool's connections. The group commit uses about one at a time.
        self._ingest_engine = make_engine(url, ping=False, pool_size=2) if array else self.engine
        self._writer = GroupCommitter(
            self._ingest_engine, self._insert_array if array else self._insert_rows
        )

    def close(self) -> None:
        """Release every pooled connection."""
        self.engine.dispose()
        self._ingest_engine.dispose()

    # -- tenants and tokens ---------------------------------------------------------------

    def ensure_tenant(self, name: str) -> int:
        """The id of tenant `name`, created when missing; ValueError for a name not allowed."""
        with self.sessions() as session:
            found = session.scalar(select(Tenant.id).where(Tenant.name == name))
            if found is not None:
                # A tenant created before names were checked stays reachable by its name.
                return found
            problem = tenant_name_problem(name)
            if problem is not None:
                raise ValueError(problem)
            tenant = Tenant(name=name, created_at=datetime.now(UTC))
            session.add(tenant)
            try:
                session.commit()
            except IntegrityError:  # created concurrently
                session.rollback()
                return int(session.scalars(select(Tenant.id).where(Tenant.name == name)).one())
            return tenant.id

    def set_require_approval(self, tenant: str, required: bool) -> int:
        """Whether candidates of `tenant` (created when missing) wait for an approval before
        they serve; returns the tenant's id."""
        tenant_id = self.ensure_tenant(tenant)
        with self.sessions() as session:
            row = session.get(Tenant, tenant_id)
            assert row is not None  # just ensured
            row.require_approval = required
            session.commit()
        return tenant_id

    def requires_approval(self, tenant_id: int) -> bool:
        """The tenant's approval setting (False for an unknown tenant)."""
        with self.sessions() as session:
            found = session.scalar(select(Tenant.require_approval).where(Tenant.id == tenant_id))
        return bool(found)

    def create_token(self, tenant: str, *, label: str | None = None, admin: bool = False) -> str:
        """A new bearer token for `tenant` (created when missing); only its hash is kept.

        `label` names its holder (the history records it as who acted); an `admin` token reads
        and acts on every tenant. ValueError for a tenant name or label not allowed.
        """
        if label is not None:
            problem = token_label_problem(label)
            if problem is not None:
                raise ValueError(problem)
        tenant_id = self.ensure_tenant(tenant)
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self.sessions() as session:
            session.add(
                ApiToken(
                    tenant_id=tenant_id,
                    token_hash=hash_token(token),
                    created_at=datetime.now(UTC),
                    label=label,
                    admin=admin,
                )
            )
            session.commit()
        return token

    def revoke_token(self, token: str) -> bool:
        """Make `token` unusable; False when it was unknown or already revoked."""
        with self.sessions() as session:
            row = session.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token)))
            if row is None or row.revoked_at is not None:
                return False
            row.revoked_at = datetime.now(UTC)
            session.commit()
            self._principals.pop(row.token_hash, None)
            return True

    def cached_principal(self, token: str) -> Principal | None:
        """The tenant of `token` if a recent lookup is cached (no I/O), else None."""
        cached = self._principals.get(hash_token(token))
        if cached is not None and cached[1] > time.monotonic():
            return cached[0]
        return None

    def principal_for_token(self, token: str) -> Principal | None:
        """The tenant a live token belongs to, or None.

        Answers are cached for `TOKEN_CACHE_S` seconds: a token revoked by another process (the
        CLI, another replica) stops working within that time; one revoked here, at once.
        """
        cached = self.cached_principal(token)
        if cached is not None:
            return cached
        key = hash_token(token)
        now = time.monotonic()
        with self.sessions() as session:
            row = session.execute(
                select(Tenant.id, Tenant.name, ApiToken.label, ApiToken.admin, ApiToken.id)
                .join(ApiToken, ApiToken.tenant_id == Tenant.id)
                .where(ApiToken.token_hash == key, ApiToken.revoked_at.is_(None))
            ).first()
        principal = Principal(row[0], row[1], row[2], bool(row[3]), row[4]) if row else None
        if principal is not None:  # unknown tokens are not cached: they may be created next
            if len(self._principals) >= TOKEN_CACHE_MAX:
                self._principals.clear()
            self._principals[key] = (principal, now + TOKEN_CACHE_S)
        return principal

    # -- events -------------------------------------------------------------------------------

    def insert_events(
        self,
        tenant_id: int,
        events: Sequence[AnyEvent],
        serialized: Sequence[str] | None = None,
        event_ids: Sequence[str] | None = None,
        *,
        joined: str | None = None,
    ) -> set[str]:
        """Store events not stored before; returns the ids that were new.

        `serialized` and `event_ids`, when given, are each event's `model_dump_json()` and
        `str(event_id)`, already made; `joined`, when given, is all of `events` as one JSON array
        (what PostgreSQL's "array" path sends).
        """
        if not events:
            return set()
        ids = event_ids if event_ids is not None else [str(e.event_id) for e in events]
        if self.dialect == "postgresql" and self.pg_ingest == "array":
            if joined is None or len(set(ids)) < len(ids):
                # Joined here from the texts, and the same id twice in a batch: one row, one answer.
                texts = serialized if serialized is not None else _texts(events)
                unique: dict[str, str] = {}
                for event_id, text in zip(ids, texts, strict=True):
                    unique.setdefault(event_id, text)  # the first copy is the one stored
                joined = "[" + ",".join(unique.values()) + "]"
            return self._writer.insert(ArrayBatch(tenant_id, datetime.now(UTC), joined))
        texts = serialized if serialized is not None else _texts(events)
        stamp = _sqlite_datetime if self.dialect == "sqlite" else _same
        now = stamp(datetime.now(UTC))
        rows: list[Row] = []
        seen: set[str] = set()
        for item, text, event_id in zip(events, texts, ids, strict=True):
            if event_id in seen:
                continue  # the same id twice in one batch: one row, one answer
            seen.add(event_id)
            label = _label(item)
            rows.append(
                (
                    tenant_id,
                    event_id,
                    item.type,
                    item.decision_id,
                    label,
                    stamp(item.time),
                    now,
                    text,
                )
            )
        # Concurrent requests share a transaction, so one fsync covers them all.
        return self._writer.insert(rows)

    def _insert_rows(self, connection: Connection, rows: Sequence[Row]) -> set[str]:
        """Insert-ignore `rows` on `connection`; the event ids that were new.

        Plain driver SQL with a multi-row VALUES per chunk: SQLAlchemy's per-value type
        processing and parameter building cost more CPU than the insert itself (profiled), and
        the values are already in the form the column takes (JSON text, datetimes as the
        dialect stores them). The SQL text per chunk size is built once and cached.
        """
        new: set[str] = set()
        for start in range(0, len(rows), INSERT_CHUNK_ROWS):
            chunk = rows[start : start + INSERT_CHUNK_ROWS]
            params = tuple(value for row in chunk for value in row)
            result = connection.exec_driver_sql(self._insert_sql(len(chunk)), params)
            new.update(row[0] for row in result)
        return new

    @staticmethod
    def _insert_array(connection: Connection, batch: ArrayBatch) -> set[str]:
        """Insert-ignore one batch as a single JSON array parameter (PostgreSQL); the new ids.

        One short statement whatever the batch size: psycopg neither rebuilds nor re-parses
        its text per batch (its query cache skips long texts such as an 800-placeholder VALUES
        list, which cost more client CPU than the insert), and adapts 3 values, not 8 per row.
        """
        result = connection.exec_driver_sql(
            _PG_ARRAY_INSERT, (batch.tenant_id, batch.received_at, batch.events_json)
        )
        return {row[0] for row in result}

    def _insert_sql(self, count: int) -> str:
        sql = self._insert_sql_cache.get(count)
        if sql is None:
            if self.dialect == "postgresql":
                one = "(%s, %s, %s, %s, %s, %s, %s, %s::jsonb)"
            else:
                one = "(?, ?, ?, ?, ?, ?, ?, ?)"
            sql = (
                "INSERT INTO events (tenant_id, event_id, type, decision_id, label, time, "
                f"received_at, body) VALUES {', '.join([one] * count)} "
                "ON CONFLICT (tenant_id, event_id) DO NOTHING RETURNING event_id"
            )
            self._insert_sql_cache[count] = sql
        return sql

    def event_ids(self, tenant_id: int) -> list[str]:
        """Every stored event id of a tenant, in arrival order (tests and audits)."""
        with self.sessions() as session:
            return list(
                session.scalars(
                    select(StoredEvent.event_id)
                    .where(StoredEvent.tenant_id == tenant_id)
                    .order_by(StoredEvent.id)
                )
            )

    def events(
        self, tenant_id: int, *, type: str | None = None, after_id: int = 0, limit: int = 1000
    ) -> list[tuple[int, dict[str, Any]]]:
        """`(row id, event)` of a tenant in arrival order, paged by `after_id` (for the trainer)."""
        query = select(StoredEvent.id, StoredEvent.body).where(
            StoredEvent.tenant_id == tenant_id, StoredEvent.id > after_id
        )
        if type is not None:
            query = query.where(StoredEvent.type == type)
        with self.sessions() as session:
            result = session.execute(query.order_by(StoredEvent.id).limit(limit)).all()
        return [(row[0], row[1]) for row in result]

    def summary(self, tenant_id: int) -> dict[str, Any]:
        """Decisions per action, outcomes per kind and retention measurements of a tenant."""
        with self.sessions() as session:
            counts = session.execute(
                select(StoredEvent.type, StoredEvent.label, func.count())
                .where(StoredEvent.tenant_id == tenant_id)
                .group_by(StoredEvent.type, StoredEvent.label)
            ).all()
        decisions: dict[str, int] = {}
        outcomes: dict[str, int] = {}
        next_edits: dict[str, int] = {}
        retention = 0
        for kind, label, count in counts:
            if kind == "decision":
                decisions[label or ""] = int(count)
            elif kind == "outcome":
                outcomes[label or ""] = int(count)
            elif kind == "next_edit":
                next_edits[label or ""] = int(count)
            else:
                retention += int(count)
        return {
            "events": sum(int(c) for _, _, c in counts),
            "decisions": decisions,
            "outcomes": outcomes,
            "retention": retention,
            "next_edits": next_edits,
        }

    def tenants(self) -> list[tuple[int, str]]:
        """`(id, name)` of every tenant, by name."""
        with self.sessions() as session:
            rows = session.execute(select(Tenant.id, Tenant.name).order_by(Tenant.name)).all()
        return [(int(row[0]), str(row[1])) for row in rows]

    def tenant_id(self, name: str) -> int | None:
        """The id of tenant `name`, or None (never creates one)."""
        with self.sessions() as session:
            found = session.scalar(select(Tenant.id).where(Tenant.name == name))
        return int(found) if found is not None else None

    def session(self) -> Session:
        """A new ORM session, for routes added by other areas of the backend."""
        return self.sessions()


def _sqlite_datetime(value: datetime) -> str:
    # What SQLAlchemy's SQLite DateTime stores (the wall time, offset dropped), so rows written
    # here read back exactly like rows written through the ORM. In UTC first: an event stamped
    # +02:00 must sort and bucket with the others (PostgreSQL's timestamptz does this itself).
    if value.tzinfo is not None:
        value = value.astimezone(UTC)
    return (
        f"{value.year:04d}-{value.month:02d}-{value.day:02d} "
        f"{value.hour:02d}:{value.minute:02d}:{value.second:02d}.{value.microsecond:06d}"
    )


def _texts(events: Sequence[AnyEvent]) -> list[str]:
    return [event.model_dump_json() for event in events]


def _same(value: datetime) -> datetime:
    return value


def _label(item: AnyEvent) -> str | None:
    if isinstance(item, DecisionEvent):
        return item.action
    if isinstance(item, OutcomeEvent | NextEditEvent):
        return item.kind
    return str(item.after_s)
