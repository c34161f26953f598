"""One retrying HTTP client for everything that sends to the backend.

The rule (OpenTelemetry's OTLP exporters', widened to 408 and 500):

- 408, 429, 500, 502, 503 and 504 and connection errors and timeouts are transient: retried
  with jittered exponential backoff, honouring `Retry-After` (delta-seconds or an HTTP date,
  capped) as a lower bound on the wait, never a shorter one (`Retry-After: 0` must not turn the
  retries into a tight loop). The backend answers 408 for a stalled upload and 500 for a
  database timeout, both of which pass (the backend deduplicates events by id, so resending a
  batch it may have stored is safe);
- every retry and every wait stays under one overall deadline; a wait that would end past it is
  not started, and the call gives up with `Unavailable`;
- any other answer that is not 2xx is raised as `Refused` with its status, and the caller
  decides what it means: an answer about what was sent (400, 413, 422) may justify dropping or
  quarantining it, while one about the client (401, 403, 404: a rotated token, a wrong URL, a
  proxy) says nothing against the data, which should be kept for a later try;
- waits are on a `threading.Event`, so shutting down interrupts them at once.

Clock and sleep are parameters, so tests can run the rule on a fake clock.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime

import httpx

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
MAX_RETRY_AFTER_S = 3600.0

Sleep = Callable[[float, "threading.Event | None"], bool]
"""`sleep(seconds, stop)`: wait; True when `stop` was set (the wait was interrupted)."""


def event_sleep(seconds: float, stop: threading.Event | None) -> bool:
    """The real wait: on `stop` when there is one, so setting it ends the wait at once."""
    if stop is None:
        time.sleep(max(seconds, 0.0))
        return False
    return stop.wait(max(seconds, 0.0))


def parse_retry_after(
    value: str | None, now: float | None = None, cap: float = MAX_RETRY_AFTER_S
) -> float | None:
    """Seconds to wait from a `Retry-After` header (delta-seconds or HTTP date), or None.

    `now` is the wall-clock time (seconds since the epoch) an HTTP date is measured from; a date
    in the past means no wait, and any wait is capped at `cap` so one header cannot park a
    client for a day.
    """
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            # The asctime form and a `-0000` zone parse as naive; HTTP dates are always GMT, and
            # `.timestamp()` would read a naive one as local time.
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), cap)


@dataclass(frozen=True)
class Backoff:
    """Jittered exponential backoff: `initial_s` doubling per attempt up to `max_s`."""

    initial_s: float = 0.5
    max_s: float = 30.0

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The wait before retry number `attempt` (0 for the first retry)."""
        base = min(self.max_s, self.initial_s * (2.0 ** min(attempt, 64)))
        # Half to all of the base: jitter spreads a fleet's retries after a shared outage.
        return base * (0.5 + 0.5 * (rng or random).random())


@dataclass(frozen=True)
class RetryPolicy:
    """How long and how often one call retries."""

    deadline_s: float = 30.0
    backoff: Backoff = Backoff()
    max_retry_after_s: float = MAX_RETRY_AFTER_S
    # True: each attempt's timeout is cut to what is left of the deadline, so the whole call
    # ends by it (a sender's shutdown budget). False: the deadline bounds only retries and
    # waits, and an attempt keeps the full request timeout (a large upload may need it).
    attempts_within_deadline: bool = True


class HttpFailure(Exception):
    """A call that did not end in a 2xx answer."""


class Refused(HttpFailure):
    """A non-2xx answer that is not retried (any status outside `RETRYABLE_STATUS`): sending
    the same request again at once will not help. Whether the request itself is at fault (and
    may be dropped) or the client is (a 401, 403 or 404: keep the data) is the caller's call,
    made on `status`."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.status = response.status_code
        self.detail = error_detail(response)
        super().__init__(f"HTTP {self.status}: {self.detail}")


class Unavailable(HttpFailure):
    """Transient failures lasted past the deadline, or shutdown interrupted a wait: the request
    may succeed later.

    `not_before` is the monotonic time the server's last `Retry-After` asked to wait until
    (None when it sent none), for a caller that rests between rounds.
    """

    def __init__(
        self,
        problem: str,
        *,
        status: int | None = None,
        not_before: float | None = None,
        interrupted: bool = False,
    ) -> None:
        super().__init__(problem)
        self.problem = problem
        self.status = status
        self.not_before = not_before
        self.interrupted = interrupted


@dataclass
class RetryStats:
    """What one client has done since it was made."""

    attempts: int = 0  # requests started, answered or not
    responses: int = 0  # requests answered (any status)
    retries: int = 0
    bytes_sent: int = 0  # bodies of answered requests
    bytes_received: int = 0  # bodies of answers
    last_retry_delay_s: float = 0.0
    last_error: str = ""


def error_detail(response: httpx.Response, limit: int = 500) -> str:
    """A short account of a failed answer: FastAPI's `detail` when there is one, else the text."""
    try:
        payload = response.json()
    except ValueError:
        return response.text[:limit]
    if isinstance(payload, dict) and "detail" in payload:
        return str(payload["detail"])[:limit]
    return response.text[:limit]


class RetryingClient:
    """An `httpx.Client` that POSTs under the retry rule of this module.

    `stop` is the event that interrupts waits (the owner's shutdown); `close()` sets it too.
    """

    def __init__(
        self,
        *,
        base_url: str = "",
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
        policy: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
        stop: threading.Event | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        sleep: Sleep = event_sleep,
    ) -> None:
        self.policy = policy or RetryPolicy()
        self.timeout_s = timeout_s
        self.stats = RetryStats()
        self.stop = stop or threading.Event()
        self._rng = rng or random.Random()
        self._clock = clock
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=dict(headers or {}),
            timeout=timeout_s,
            transport=transport,
        )

    def close(self) -> None:
        """Interrupt any wait and close the connections."""
        self.stop.set()
        self._http.close()

    def post(
        self,
        url: str,
        *,
        content: bytes,
        headers: Mapping[str, str] | None = None,
        deadline: float | None = None,
        interruptible: bool = True,
    ) -> httpx.Response:
        """POST `content` until a 2xx answer, which is returned.

        `deadline` is a time on the client's clock (default: now plus the policy's
        `deadline_s`). With `interruptible` False the waits ignore `stop` (a final flush during
        shutdown, which has its own deadline). Raises `Refused` or `Unavailable`.
        """
        if deadline is None:
            deadline = self._clock() + self.policy.deadline_s
        attempt = 0
        not_before: float | None = None
        problem = "deadline passed before a request"  # this call's, not an earlier call's
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                raise Unavailable(problem, not_before=not_before)
            status: int | None = None
            retry_after: float | None = None
            timeout = self.timeout_s
            if self.policy.attempts_within_deadline:
                timeout = min(timeout, remaining)
            self.stats.attempts += 1
            try:
                response = self._http.post(url, content=content, headers=headers, timeout=timeout)
            except httpx.TransportError as exc:  # refused, reset, timed out
                problem = f"{type(exc).__name__}: {exc}"
                self.stats.last_error = problem
            else:
                self.stats.responses += 1
                self.stats.bytes_sent += len(content)
                self.stats.bytes_received += len(response.content)
                status = response.status_code
                if 200 <= status < 300:
                    return response
                if status not in RETRYABLE_STATUS:
                    raise Refused(response)
                problem = f"HTTP {status}: {error_detail(response, 200)}"
                self.stats.last_error = problem
                retry_after = parse_retry_after(
                    response.headers.get("Retry-After"),
                    now=self._wall_clock(),
                    cap=self.policy.max_retry_after_s,
                )
            delay = self.policy.backoff.delay(attempt, self._rng)
            if retry_after is not None:
                # A floor, not a replacement: `Retry-After: 0` (or a date already past) would
                # otherwise retry back to back until the deadline.
                delay = max(delay, retry_after)
                not_before = self._clock() + retry_after
            self.stats.last_retry_delay_s = delay
            if self._clock() + delay > deadline:
                raise Unavailable(problem, status=status, not_before=not_before)
            stop = self.stop if interruptible else None
            if (stop is not None and stop.is_set()) or self._sleep(delay, stop):
                raise Unavailable(
                    f"interrupted: {problem}",
                    status=status,
                    not_before=not_before,
                    interrupted=True,
                )
            attempt += 1
            self.stats.retries += 1
