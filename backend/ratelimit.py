"""Per-tenant rate limits: a token bucket of events per second.

`RateLimiter` keeps the buckets in this process (one instance, or SQLite); `SharedRateLimiter`
keeps them in PostgreSQL, so several instances enforce one limit per tenant together.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url


@dataclass
class TokenBucket:
    """`rate` tokens per second up to `burst`; spending more than is there must wait."""

    rate: float
    burst: float
    tokens: float
    updated: float

    def take(self, amount: float, now: float) -> float:
        """Spend `amount` and return 0, or spend nothing and return the seconds to wait."""
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if amount <= self.tokens:
            self.tokens -= amount
            return 0.0
        return (amount - self.tokens) / self.rate


class RateLimiter:
    """One token bucket per key (tenant id), created full on first use."""

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._buckets: dict[int, TokenBucket] = {}
        self._lock = threading.Lock()

    def take(self, key: int, amount: float) -> float:
        """0 when `amount` may pass now, else the seconds after which it may."""
        amount = min(amount, self.burst)  # a batch larger than the burst passes when full
        with self._lock:
            now = self._clock()
            bucket = self._buckets.get(key)
            if bucket is None:
                bucket = self._buckets[key] = TokenBucket(self.rate, self.burst, self.burst, now)
            return bucket.take(amount, now)


class Limiter(Protocol):
    """What ingestion asks of a rate limit."""

    rate: float
    burst: float

    def take(self, key: int, amount: float) -> float:
        """0 when `amount` may pass now, else the seconds after which it may."""
        ...


# One statement: refill the tenant's bucket by the time since its last update (the database's
# clock, so every instance agrees) and spend `amount` when that much is there. No row back means
# refused; the bucket is left as it was.
_SHARED_TAKE = (
    "INSERT INTO rate_buckets (tenant_id, tokens, updated_at) "
    "VALUES (%(key)s, %(burst)s - %(amount)s, clock_timestamp()) "
    "ON CONFLICT (tenant_id) DO UPDATE SET "
    "tokens = LEAST(%(burst)s, rate_buckets.tokens + %(rate)s * "
    "EXTRACT(EPOCH FROM clock_timestamp() - rate_buckets.updated_at)) - %(amount)s, "
    "updated_at = clock_timestamp() "
    "WHERE LEAST(%(burst)s, rate_buckets.tokens + %(rate)s * "
    "EXTRACT(EPOCH FROM clock_timestamp() - rate_buckets.updated_at)) >= %(amount)s "
    "RETURNING tokens"
)
_SHARED_WAIT = (
    "SELECT LEAST(%(burst)s, tokens + %(rate)s * "
    "EXTRACT(EPOCH FROM clock_timestamp() - updated_at)) "
    "FROM rate_buckets WHERE tenant_id = %(key)s"
)


@dataclass
class _Lease:
    """Tokens this process took from a shared bucket ahead of need, and until when it may
    spend them."""

    tokens: float
    until: float


class SharedRateLimiter:
    """Per-tenant token buckets in PostgreSQL, shared by every instance on the database: a
    tenant gets `rate` in total however many instances its requests reach.

    A check that goes to the database takes a lease with it: `lease_s` of the tenant's rate
    beyond the batch (500 events at the default 2,000/s), spent here by the next batches
    without a round trip, for at most `lease_ttl_s`. So most batches cost no statement at all;
    the limit still holds exactly, since every token spent was first taken from the shared
    bucket. What a lease costs is the other way: tokens one instance holds unspent are not
    available to another until they lapse, so a tenant at its limit behind N instances may be
    refused up to N leases' worth early. When the bucket has too little for a lease, the
    check takes only the batch, so a tenant near its limit is not refused for the lease.

    Each statement runs on a connection of its own pool with `synchronous_commit = off`: a
    bucket's state lost in a crash only lets a tenant send one burst early, so it is not worth
    an fsync. The pool does not ping a connection before each use (a round trip): one the
    database dropped fails its request with 503, which the client retries, and SQLAlchemy
    then replaces the pool's connections.
    """

    def __init__(
        self,
        url: str,
        rate: float,
        burst: float,
        pool_size: int = 8,
        lease_s: float = 0.25,
        lease_ttl_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        if make_url(url).get_backend_name() != "postgresql":
            raise ValueError("shared rate limits need PostgreSQL")
        self.rate = rate
        self.burst = burst
        self.lease_s = lease_s
        self.lease_ttl_s = lease_ttl_s
        self.statements = 0  # round trips to the database, for tests and the benchmark
        self._clock = clock
        self._leases: dict[int, _Lease] = {}
        self._lock = threading.Lock()
        self.engine = create_engine(
            url,
            pool_size=pool_size,
            # No overflow: connections made and closed under bursts cost more than a short wait.
            max_overflow=0,
            # One statement per check: no BEGIN and COMMIT round trips around it.
            isolation_level="AUTOCOMMIT",
            connect_args={"options": "-c synchronous_commit=off"},
        )

    def take(self, key: int, amount: float) -> float:
        """0 when `amount` may pass now (and is spent), else the seconds after which it may."""
        amount = min(amount, self.burst)
        if self._spend_leased(key, amount):
            return 0.0
        extra = max(0.0, min(self.rate * self.lease_s, self.burst - amount))
        values = {"key": key, "amount": amount + extra, "burst": self.burst, "rate": self.rate}
        with self.engine.connect() as connection:
            self.statements += 1
            if connection.exec_driver_sql(_SHARED_TAKE, values).first() is not None:
                self._lease(key, extra)
                return 0.0
            values["amount"] = amount
            if extra > 0:  # too little for a lease: the batch alone
                self.statements += 1
                if connection.exec_driver_sql(_SHARED_TAKE, values).first() is not None:
                    return 0.0
            self.statements += 1
            available = connection.exec_driver_sql(_SHARED_WAIT, values).scalar()
        return max(0.0, (amount - float(available or 0.0)) / self.rate)

    def _spend_leased(self, key: int, amount: float) -> bool:
        with self._lock:
            lease = self._leases.get(key)
            if lease is None or lease.tokens < amount or lease.until <= self._clock():
                return False
            lease.tokens -= amount
            return True

    def _lease(self, key: int, tokens: float) -> None:
        """Keep `tokens` just taken from the shared bucket, with what is left of a live lease."""
        now = self._clock()
        with self._lock:
            lease = self._leases.get(key)
            kept = lease.tokens if lease is not None and lease.until > now else 0.0
            self._leases[key] = _Lease(kept + tokens, now + self.lease_ttl_s)

    def close(self) -> None:
        self.engine.dispose()


@dataclass(frozen=True)
class RequestRateSettings:
    """Per-tenant request rates of the routes beside ingestion (per process)."""

    stats_per_s: float = 10.0
    """`/v1/stats/*`: a dashboard page asks for about five documents."""
    stats_burst: float = 100.0
    policy_per_s: float = 1.0
    """`/v1/policy/promote|rollback|approve`: actions of people, a few a minute."""
    policy_burst: float = 60.0


class RequestRates:
    """The request buckets of `RequestRateSettings`, one per tenant and kind of route."""

    def __init__(self, settings: RequestRateSettings | None = None) -> None:
        settings = settings or RequestRateSettings()
        self.settings = settings
        self.stats = RateLimiter(settings.stats_per_s, settings.stats_burst)
        self.policy = RateLimiter(settings.policy_per_s, settings.policy_burst)
