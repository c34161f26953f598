"""Per-tenant rate limits: a token bucket of events per second."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


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
