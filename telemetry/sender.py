"""The sender: a background thread that moves spooled events to the backend.

It wakes when a full batch is waiting or every `flush_interval_s`, posts up to `batch_size`
events gzipped with the tenant's bearer token, and deletes from the spool only the events the
backend answered as accepted or already stored. Throttling, outages and transient server errors
(408, 429, 500, 502, 503, 504, connection errors) are retried with jittered exponential backoff
under a deadline, honouring `Retry-After`; after the deadline the events simply stay spooled for
the next round.

Only an answer about the events themselves quarantines them: 400 and 422 (the batch is
malformed), 413 for a single event (a larger batch is split first), and the per-event
rejections of a 2xx answer. Any other refusal (401, 403, 404, 405, 410, ...) is about the client:
a rotated token, a wrong URL, a proxy in the way. The events are kept, the error is recorded in
`stats.last_error`, and the sender rests `refused_rest_s` (doubling per refusal up to
`refused_rest_max_s`) before it tries again; quarantining there would empty a user's whole spool
within seconds of a token expiring.

The spooled bodies are spliced into the request as they are, not re-encoded; so each is first
checked to be an event of the shared schema whose id is the one it was spooled under. One that
is not (a damaged row) would make the whole request invalid JSON and cost the whole batch: it
is quarantined alone, counted in the spool's `invalid_events`, and the rest are sent.

Every wait is on an `Event`, so `shutdown()` interrupts it and spends its remaining time on one
last flush; what is still spooled then is sent by the next process. The retry rule itself is
`common.http.RetryingClient`, the one every sender to the backend uses.
"""

from __future__ import annotations

import enum
import gzip
import logging
import random
import threading
import time
from dataclasses import dataclass

import httpx
from pydantic import ValidationError

from common.http import (
    MAX_RETRY_AFTER_S,
    RETRYABLE_STATUS,
    Backoff,
    Refused,
    RetryingClient,
    RetryPolicy,
    Unavailable,
    parse_retry_after,
)
from telemetry.events import EVENT_ADAPTER, BatchMeta, IngestResponse
from telemetry.spool import Spool, SpooledEvent

log = logging.getLogger(__name__)

__all__ = [
    "EVENTS_PATH",
    "MAX_RETRY_AFTER_S",
    "QUARANTINE_STATUS",
    "RETRYABLE_STATUS",
    "Export",
    "Sender",
    "SenderStats",
    "encode_batch",
    "parse_retry_after",
    "screen_batch",
]

EVENTS_PATH = "/v1/events"

# Refusals that judge the events sent, not the client sending them: only these quarantine a
# batch (413 only once the batch is down to one event).
QUARANTINE_STATUS = frozenset({400, 413, 422})


class Export(enum.Enum):
    """How one attempt to deliver a batch ended."""

    DELIVERED = "delivered"  # 2xx: the answered events left the spool
    FINAL = "final"  # the events were refused for good: quarantined
    PENDING = "pending"  # not delivered yet: still spooled, try later
    HELD = "held"  # the client was refused (401, 404...): still spooled, rest long, try later


@dataclass
class SenderStats:
    """Counters of this sender since it started (the spool keeps the persistent ones)."""

    requests: int = 0
    sent_events: int = 0
    duplicate_events: int = 0
    quarantined_events: int = 0
    invalid_events: int = 0  # of quarantined_events: not sendable as spooled
    retries: int = 0
    refusals: int = 0  # batches kept after a refusal about the client (401, 403, 404...)
    last_retry_delay_s: float = 0.0
    last_error: str = ""


def screen_batch(batch: list[SpooledEvent]) -> tuple[list[SpooledEvent], dict[str, str]]:
    """The events fit to splice into a request, and why each of the others is not.

    A body must parse as one event of the shared schema, and carry the id it was spooled under
    (the backend answers by that id; another would leave the row to be resent forever).
    """
    good: list[SpooledEvent] = []
    bad: dict[str, str] = {}
    for event in batch:
        try:
            parsed = EVENT_ADAPTER.validate_json(event.body)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"])
            bad[event.event_id] = f"invalid spooled body: {where}: {error['msg']}"[:300]
            continue
        if str(parsed.event_id) != event.event_id:
            bad[event.event_id] = f"spooled body has event_id {parsed.event_id}"
            continue
        good.append(event)
    return good, bad


def encode_batch(batch: list[SpooledEvent], meta: BatchMeta | None = None) -> bytes:
    """The gzipped request body for spooled events (already JSON: joined, not re-encoded),
    with the sender's `meta` when given.

    Every body must have passed `screen_batch`.
    """
    tail = b"]}" if meta is None else b'],"meta":' + meta.model_dump_json().encode() + b"}"
    payload = b'{"events":[' + b",".join(event.body for event in batch) + tail
    return gzip.compress(payload, compresslevel=5)


class Sender:
    """Delivers a spool's events to `POST {url}/v1/events` from a background thread."""

    def __init__(
        self,
        spool: Spool,
        *,
        url: str,
        token: str,
        batch_size: int = 100,
        flush_interval_s: float = 2.0,
        request_timeout_s: float = 10.0,
        retry_deadline_s: float = 30.0,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
        refused_rest_s: float = 300.0,
        refused_rest_max_s: float = 3600.0,
        transport: httpx.BaseTransport | None = None,
        rng: random.Random | None = None,
        install_id: str | None = None,
    ) -> None:
        self.spool = spool
        # With an installation id, each batch says how full the spool is (`BatchMeta`); a
        # backend that answers such a batch 400 is older than `meta`: it is left out from then.
        self.install_id = install_id
        self._send_meta = install_id is not None
        self.url = url.rstrip("/") + EVENTS_PATH
        self.batch_size = batch_size
        self.flush_interval_s = flush_interval_s
        self.request_timeout_s = request_timeout_s
        self.retry_deadline_s = retry_deadline_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.stats = SenderStats()
        self._rng = rng or random.Random()
        self._backoff = Backoff(backoff_initial_s, backoff_max_s)
        # Long: a refused token or URL is fixed by a person, not by the next few seconds.
        self._refused_backoff = Backoff(refused_rest_s, refused_rest_max_s)
        self._refusals = 0  # consecutive refusals about the client, for that resting backoff
        self._stop = threading.Event()
        # The stop event interrupts the client's waits: shutdown never waits out a Retry-After.
        self._http = RetryingClient(
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                "Content-Encoding": "gzip",
                "User-Agent": "tabloop-telemetry/1",
            },
            timeout_s=request_timeout_s,
            policy=RetryPolicy(deadline_s=retry_deadline_s, backoff=self._backoff),
            transport=transport,
            stop=self._stop,
            rng=self._rng,
        )
        self._wake = threading.Event()
        self._enabled = threading.Event()  # cleared while the user has telemetry off
        self._enabled.set()
        self._final_deadline = 0.0
        self._thread: threading.Thread | None = None
        self._failures = 0  # consecutive failed rounds, for the resting backoff
        self._not_before = 0.0  # monotonic time before which we must not send (Retry-After)
        self._batch_limit = batch_size  # shrinks after a 413, grows back on success

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the background thread."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tabloop-sender", daemon=True)
            self._thread.start()

    def wake(self) -> None:
        """Ask for a send now (a full batch is waiting)."""
        self._wake.set()

    def set_enabled(self, enabled: bool) -> None:
        """Pause (telemetry was turned off: nothing more leaves the machine) or resume."""
        if enabled:
            self._enabled.set()
            self._wake.set()
        else:
            self._enabled.clear()

    def shutdown(self, timeout: float) -> bool:
        """Stop, sending what can be sent within `timeout`; True when the spool was emptied."""
        self._final_deadline = time.monotonic() + max(timeout, 0.0)
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout + self.request_timeout_s + 1.0)
        elif self._enabled.is_set():
            self.drain(self._final_deadline)
        self._http.close()
        return len(self.spool) == 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            if not self._enabled.is_set():
                continue
            rest = self._not_before - time.monotonic()
            if rest > 0 and self._stop.wait(rest):
                break
            try:
                delivered = self.drain(time.monotonic() + self.retry_deadline_s)
            except Exception:  # the sender must outlive any one bad round
                log.exception("telemetry sender round failed")
                delivered = False
            if delivered:
                self._failures = 0
            else:
                self._failures += 1
                self._stop.wait(self._backoff.delay(self._failures, self._rng))
        if not self._enabled.is_set():
            return
        try:
            self.drain(self._final_deadline)
        except Exception:
            log.exception("telemetry final flush failed")

    # -- sending ------------------------------------------------------------------------------

    def drain(self, deadline: float) -> bool:
        """Send batches until the spool is empty (True) or a batch stays spooled (False: pending
        or held after a refusal about the client)."""
        while time.monotonic() < deadline:
            if not self._enabled.is_set():
                return False
            batch = self.spool.peek(self._batch_limit)
            if not batch:
                return True
            if self.export(batch, deadline) in (Export.PENDING, Export.HELD):
                return False
            if self._stop.is_set() and time.monotonic() >= self._final_deadline:
                return False
        return len(self.spool) == 0

    def export(self, batch: list[SpooledEvent], deadline: float) -> Export:
        """Deliver one batch, retrying transient failures until `deadline`."""
        batch, invalid = screen_batch(batch)
        for event_id, reason in invalid.items():
            moved = self.spool.quarantine([event_id], status=None, reason=reason, invalid=True)
            self.stats.quarantined_events += moved
            self.stats.invalid_events += moved
        if not batch:
            return Export.FINAL
        meta = self._meta(len(batch))
        body = encode_batch(batch, meta)
        # The final flush runs after `_stop` is set: its waits must not end at once, and its
        # deadline (the shutdown budget) already bounds them.
        final_flush = self._stop.is_set()
        if final_flush:
            deadline = min(deadline, self._final_deadline)
        try:
            response = self._http.post(
                self.url, content=body, deadline=deadline, interruptible=not final_flush
            )
        except Unavailable as exc:
            self._copy_stats()
            if exc.not_before is not None:
                self._not_before = exc.not_before
            return Export.PENDING
        except Refused as exc:
            self._copy_stats()
            self.stats.last_error = f"HTTP {exc.status}: {exc.response.text[:200]}"
            if exc.status == 400 and meta is not None:
                # Perhaps a backend that does not know `meta`: send the batch again without it.
                log.info("backend refused a batch with meta; sending without it from now on")
                self._send_meta = False
                return Export.DELIVERED
            if exc.status == 413 and len(batch) > 1:
                # Too large together: halve the batch and let drain() go on with it.
                self._batch_limit = max(1, len(batch) // 2)
                return Export.DELIVERED
            if exc.status in QUARANTINE_STATUS:
                return self._final(batch, exc.status, exc.response.text)
            return self._held()
        self._copy_stats()
        return self._delivered(batch, response)

    def _meta(self, sending: int) -> BatchMeta | None:
        """The spool's backlog after this batch and its dropped count, or None (not sent)."""
        if not self._send_meta or self.install_id is None:
            return None
        try:
            stats = self.spool.stats()
            return BatchMeta(
                install_id=self.install_id,
                spool_backlog=max(0, stats.events - sending),
                spool_dropped=stats.dropped_events,
            )
        except Exception:  # statistics must never stop a batch
            log.debug("no batch meta", exc_info=True)
            return None

    def _copy_stats(self) -> None:
        """Mirror the client's counters (it sends for this sender alone)."""
        sent = self._http.stats
        self.stats.requests = sent.attempts
        self.stats.retries = sent.retries
        self.stats.last_retry_delay_s = sent.last_retry_delay_s
        if sent.last_error:
            self.stats.last_error = sent.last_error

    def _delivered(self, batch: list[SpooledEvent], response: httpx.Response) -> Export:
        try:
            answer = IngestResponse.model_validate_json(response.content)
        except ValidationError as exc:
            # Stored or not, we cannot tell: keep the events; a resend is deduplicated.
            self.stats.last_error = f"unreadable answer: {exc.errors()[:1]}"
            return Export.PENDING
        in_batch = {event.event_id for event in batch}
        done = (set(answer.accepted) | set(answer.duplicate)) & in_batch
        self.spool.remove(done)
        self.stats.sent_events += len(set(answer.accepted) & in_batch)
        self.stats.duplicate_events += len(set(answer.duplicate) & in_batch)
        refused = 0
        for rejection in answer.rejected:
            if 0 <= rejection.index < len(batch):
                event_id = batch[rejection.index].event_id
                refused += self.spool.quarantine(
                    [event_id], status=response.status_code, reason=rejection.error
                )
        self.stats.quarantined_events += refused
        if not done and not refused:
            # An answer that settles nothing would have us resend the same batch at once.
            self.stats.last_error = "answer named none of the batch's events"
            return Export.PENDING
        if self._batch_limit < self.batch_size:
            self._batch_limit = min(self.batch_size, self._batch_limit * 2)
        self._not_before = 0.0
        self._refusals = 0
        return Export.DELIVERED

    def _held(self) -> Export:
        """Keep the batch after a refusal about the client, and rest long before the next try
        (the background loop honours `_not_before`)."""
        rest = self._refused_backoff.delay(self._refusals, self._rng)
        self._refusals += 1
        self.stats.refusals += 1
        self._not_before = max(self._not_before, time.monotonic() + rest)
        self.stats.last_error += f" (events kept; next try in {rest:.0f} s)"
        log.warning("telemetry refused: %s", self.stats.last_error)
        return Export.HELD

    def _final(self, batch: list[SpooledEvent], status: int, text: str) -> Export:
        moved = self.spool.quarantine(
            [event.event_id for event in batch], status=status, reason=text or f"HTTP {status}"
        )
        self.stats.quarantined_events += moved
        return Export.FINAL
