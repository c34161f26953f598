"""Several backend instances on one PostgreSQL database: leases and training jobs.

Every time here is the database's clock (`clock_timestamp()`), never a machine's: instances on
machines whose clocks disagree still agree on who holds a lease.

- `Lease`: a named role one process holds at a time (`trainer`, the elected training
  scheduler). Taking it is one upsert that succeeds when the row is free, expired, or already
  ours; its holder renews it every `renew_s`; a process killed without releasing it loses it
  when it expires. `epoch` grows each time the role changes hands, so a write that checks the
  holder and the epoch in its own transaction (`fence`) cannot come from a holder that lost it.
- `JobQueue`: per-tenant training jobs. The elected scheduler marks a tenant wanted up to its
  newest event; any trainer process claims one with `SELECT … FOR UPDATE SKIP LOCKED` (so
  trainers on other machines never wait on each other), renews its claim while it trains, and
  marks it done. A claim that expires (its trainer died) is claimed again; the old claimant's
  writes fail their fence.

SQLite has one writer and one machine: there the backend keeps its file lock (`backend/cli.py`)
and the in-process scheduler (`backend/policy/loop.py`).
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.orm import Session

TRAINER_LEASE = "trainer"


class LeaseLost(Exception):
    """The lease or job claim a write depended on is no longer held by this process."""


def holder_id(role: str = "backend") -> str:
    """A name for this process that no other process shares: host, pid and a random part."""
    return f"{role}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def pid_of_holder(holder: str) -> int | None:
    """The process id inside a `holder_id` (for tools on the same machine), or None."""
    try:
        return int(holder.rsplit(":", 2)[-2])
    except (ValueError, IndexError):
        return None


@dataclass(frozen=True)
class LeaseState:
    """Who holds a lease now, by the database."""

    holder: str
    epoch: int
    live: bool


_ACQUIRE = text(
    """
    INSERT INTO backend_leases (name, holder, epoch, acquired_at, expires_at)
    VALUES (:name, :holder, 1, clock_timestamp(), clock_timestamp() + make_interval(secs => :ttl))
    ON CONFLICT (name) DO UPDATE SET
        holder = excluded.holder,
        epoch = CASE WHEN backend_leases.holder = excluded.holder THEN backend_leases.epoch
                     ELSE backend_leases.epoch + 1 END,
        acquired_at = CASE WHEN backend_leases.holder = excluded.holder
                           THEN backend_leases.acquired_at ELSE excluded.acquired_at END,
        expires_at = excluded.expires_at
    WHERE backend_leases.holder = excluded.holder OR backend_leases.expires_at <= clock_timestamp()
    RETURNING epoch
    """
)


class Lease:
    """The lease `name` as seen by one would-be holder."""

    def __init__(self, engine: Engine, name: str, holder: str, ttl_s: float) -> None:
        if engine.dialect.name != "postgresql":
            raise ValueError("leases in the database need PostgreSQL (SQLite: the file lock)")
        if ttl_s <= 0:
            raise ValueError("a lease lasts a positive time")
        self.engine = engine
        self.name = name
        self.holder = holder
        self.ttl_s = ttl_s
        self.epoch: int | None = None  # set while held

    def acquire(self) -> bool:
        """Take or renew the lease; True when this holder has it until `ttl_s` from now."""
        with self.engine.begin() as connection:
            epoch = connection.execute(
                _ACQUIRE, {"name": self.name, "holder": self.holder, "ttl": self.ttl_s}
            ).scalar()
        self.epoch = int(epoch) if epoch is not None else None
        return self.epoch is not None

    def release(self) -> None:
        """Give the lease up now (a clean stop), so another instance takes it at once."""
        with self.engine.begin() as connection:
            connection.execute(
                text(
                    "UPDATE backend_leases SET expires_at = clock_timestamp() "
                    "WHERE name = :name AND holder = :holder"
                ),
                {"name": self.name, "holder": self.holder},
            )
        self.epoch = None

    def fence(self, session: Session | Connection) -> None:
        """Raise `LeaseLost` unless this holder still holds the lease, inside the caller's
        transaction; the row stays locked until it commits, so no one takes the lease over
        between this check and that commit."""
        if self.epoch is None or not _held(session, self.name, self.holder, self.epoch):
            raise LeaseLost(f"lease {self.name!r} is no longer held by {self.holder}")


def _held(session: Session | Connection, name: str, holder: str, epoch: int) -> bool:
    row = session.execute(
        text(
            "SELECT 1 FROM backend_leases WHERE name = :name AND holder = :holder "
            "AND epoch = :epoch AND expires_at > clock_timestamp() FOR UPDATE"
        ),
        {"name": name, "holder": holder, "epoch": epoch},
    ).first()
    return row is not None


def lease_state(engine: Engine, name: str) -> LeaseState | None:
    """Who holds lease `name` (None: nobody ever did)."""
    with engine.connect() as connection:
        row = connection.execute(
            text(
                "SELECT holder, epoch, expires_at > clock_timestamp() FROM backend_leases "
                "WHERE name = :name"
            ),
            {"name": name},
        ).first()
    return LeaseState(str(row[0]), int(row[1]), bool(row[2])) if row is not None else None


@dataclass(frozen=True)
class JobClaim:
    """A training job this trainer holds: the tenant, which claim it is, and up to which event
    the tenant was wanted when it was claimed."""

    tenant_id: int
    claim: int
    through_event_id: int
    attempts: int


JOB_TABLES = ("training_jobs", "adapter_jobs")  # policy training, adapter training

_CLAIM = """
    UPDATE {table} SET
        claimed_by = :holder,
        claim = claim + 1,
        claim_event_id = wanted_event_id,
        lease_until = clock_timestamp() + make_interval(secs => :ttl),
        attempts = attempts + 1,
        updated_at = clock_timestamp()
    WHERE tenant_id = (
        SELECT tenant_id FROM {table}
        WHERE wanted_event_id > done_event_id
          AND (lease_until IS NULL OR lease_until <= clock_timestamp())
        ORDER BY updated_at
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    )
    RETURNING tenant_id, claim, claim_event_id, attempts
"""


class JobQueue:
    """Per-tenant training jobs in the database (PostgreSQL): the policy's (`training_jobs`,
    the default) or the adapters' (`adapter_jobs`)."""

    def __init__(
        self, engine: Engine, holder: str, ttl_s: float, table: str = "training_jobs"
    ) -> None:
        if engine.dialect.name != "postgresql":
            raise ValueError("training jobs in the database need PostgreSQL")
        if table not in JOB_TABLES:
            raise ValueError(f"not a job table: {table!r}")
        self.engine = engine
        self.holder = holder
        self.ttl_s = ttl_s
        self.table = table  # one of JOB_TABLES: safe to write into the statements

    def want(self, tenant_id: int, through_event_id: int) -> None:
        """Ask for a training run of the tenant covering events up to `through_event_id`."""
        with self.engine.begin() as connection:
            connection.execute(
                text(
                    f"INSERT INTO {self.table} (tenant_id, wanted_event_id, done_event_id, claim, "
                    "claim_event_id, attempts, runs, updated_at) "
                    "VALUES (:t, :e, 0, 0, 0, 0, 0, clock_timestamp()) "
                    "ON CONFLICT (tenant_id) DO UPDATE SET wanted_event_id = "
                    f"GREATEST({self.table}.wanted_event_id, excluded.wanted_event_id)"
                ),
                {"t": tenant_id, "e": through_event_id},
            )

    def claim(self) -> JobClaim | None:
        """Claim the longest-waiting wanted job nobody holds, or None."""
        with self.engine.begin() as connection:
            row = connection.execute(
                text(_CLAIM.format(table=self.table)), {"holder": self.holder, "ttl": self.ttl_s}
            ).first()
        if row is None:
            return None
        return JobClaim(int(row[0]), int(row[1]), int(row[2]), int(row[3]))

    def renew(self, job: JobClaim) -> bool:
        """Extend the claim; False when it was lost (expired and taken by another trainer)."""
        with self.engine.begin() as connection:
            row = connection.execute(
                text(
                    f"UPDATE {self.table} SET lease_until = clock_timestamp() + "
                    "make_interval(secs => :ttl) WHERE tenant_id = :t AND claim = :c "
                    "AND claimed_by = :holder RETURNING 1"
                ),
                {"t": job.tenant_id, "c": job.claim, "holder": self.holder, "ttl": self.ttl_s},
            ).first()
        return row is not None

    def fence(self, job: JobClaim, session: Session | Connection) -> None:
        """Raise `LeaseLost` unless `job` is still this trainer's and unexpired, inside the
        caller's transaction (the job row stays locked until it commits: no one claims it in
        between)."""
        row = session.execute(
            text(
                f"SELECT 1 FROM {self.table} WHERE tenant_id = :t AND claim = :c "
                "AND claimed_by = :holder AND lease_until > clock_timestamp() FOR UPDATE"
            ),
            {"t": job.tenant_id, "c": job.claim, "holder": self.holder},
        ).first()
        if row is None:
            raise LeaseLost(f"training job of tenant {job.tenant_id} is no longer claimed here")

    def finish(self, job: JobClaim, *, error: str | None = None) -> bool:
        """Mark the run done up to the event it was claimed for (or, with `error`, give the job
        back to be tried again once a claim's time has passed, not at once in a loop); False
        when the claim had been lost."""
        done = "done_event_id" if error else "GREATEST(done_event_id, claim_event_id)"
        until = "clock_timestamp() + make_interval(secs => :ttl)" if error else "NULL"
        with self.engine.begin() as connection:
            row = connection.execute(
                text(
                    f"UPDATE {self.table} SET done_event_id = {done}, claimed_by = NULL, "
                    f"lease_until = {until}, runs = runs + :ran, attempts = :attempts, "
                    "last_error = :error, updated_at = clock_timestamp() "
                    "WHERE tenant_id = :t AND claim = :c AND claimed_by = :holder RETURNING 1"
                ),
                {
                    "t": job.tenant_id,
                    "c": job.claim,
                    "holder": self.holder,
                    "ran": 0 if error else 1,
                    "attempts": job.attempts if error else 0,
                    "error": error[:512] if error else None,
                    "ttl": self.ttl_s,
                },
            ).first()
        return row is not None

    def jobs(self) -> list[dict[str, Any]]:
        """Every job's row (operators, tests)."""
        with self.engine.connect() as connection:
            rows = connection.execute(
                text(
                    "SELECT tenant_id, wanted_event_id, done_event_id, claim, claimed_by, "
                    f"attempts, runs, last_error FROM {self.table} ORDER BY tenant_id"
                )
            ).mappings()
            return [dict(row) for row in rows]
