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


class SharedRateLimiter:
    """Per-tenant token buckets in PostgreSQL, shared by every instance on the database: a
    tenant gets `rate` in total however many instances its requests reach.

    Each batch costs one statement (plain driver SQL) on a connection of its own pool with
    `synchronous_commit = off`: a bucket's state lost in a crash only lets a tenant send one
    burst early, so it is not worth an fsync per batch. The pool does not ping a connection
    before each use (a round trip per batch): one the database dropped fails its request with
    503, which the client retries, and SQLAlchemy then replaces the pool's connections.
    """

    def __init__(self, url: str, rate: float, burst: float, pool_size: int = 8) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        if make_url(url).get_backend_name() != "postgresql":
            raise ValueError("shared rate limits need PostgreSQL")
        self.rate = rate
        self.burst = burst
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
        values = {"key": key, "amount": amount, "burst": self.burst, "rate": self.rate}
        with self.engine.connect() as connection:
            if connection.exec_driver_sql(_SHARED_TAKE, values).first() is not None:
                return 0.0
            available = connection.exec_driver_sql(_SHARED_WAIT, values).scalar()
        return max(0.0, (amount - float(available or 0.0)) / self.rate)

    def close(self) -> None:
        self.engine.dispose()
