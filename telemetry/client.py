"""The telemetry client: the one object the language server talks to.

`record()` applies the privacy level and puts the event on a bounded in-memory queue: a few
microseconds, no I/O, never blocks. A writer thread drains the queue into the durable spool,
committing whatever has gathered as one transaction, and wakes the sender when a batch is full.
An event is safe once the writer has committed it; `flush_to_spool()` waits for that, and says
False when a commit failed (disk full): those events are lost and counted in the spool's
`dropped_events`, not kept to retry. A full disk rarely clears within the seconds a bounded
retry buffer could cover, the in-memory queue already bounds what waits in memory, and a count
kept now tells the truth at once instead of after the buffer gives up.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from telemetry.events import AnyEvent
from telemetry.privacy import apply_level, effective_level
from telemetry.sender import Sender
from telemetry.settings import Level, TelemetrySettings
from telemetry.spool import Spool

log = logging.getLogger(__name__)

SPOOL_FILE = "spool.sqlite3"
TELEMETRY_DIR = "telemetry"
"""The telemetry client's directory under the cache: the spool and the installation's id."""
WRITER_BATCH = 1000


def install_id(directory: Path) -> str:
    """An anonymous id of this installation, made once and kept in `directory`."""
    path = directory / "install_id"
    try:
        existing = path.read_text(encoding="ascii").strip()
        if existing:
            return existing
    except (OSError, UnicodeDecodeError):
        pass
    made = uuid.uuid4().hex
    directory.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(made, encoding="ascii")
    tmp.replace(path)
    return made


def cached_install_id(cache: Path) -> str:
    """This installation's id, as its telemetry client under cache directory `cache` sends it."""
    return install_id(cache / TELEMETRY_DIR)


class TelemetryClient:
    """Records events without blocking and delivers them through the spool and the sender."""

    def __init__(
        self,
        settings: TelemetrySettings,
        directory: Path,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.directory = Path(directory)
        self.session_id = uuid.uuid4().hex
        self._transport = transport
        self._queue: queue.Queue[AnyEvent | _FlushMarker | threading.Event] = queue.Queue(
            settings.queue_max_events
        )
        self._overflow = 0
        self._overflow_lock = threading.Lock()
        self._lock = threading.Lock()
        self.spool: Spool | None = None
        self.sender: Sender | None = None
        self._writer: threading.Thread | None = None
        self._closed = False
        self._install_id = ""

    # -- level ----------------------------------------------------------------------------

    @property
    def level(self) -> Level:
        """The privacy level in force now."""
        return effective_level(self.settings.level, self.settings.client_enabled)

    @property
    def install_id(self) -> str:
        if not self._install_id:
            self._install_id = install_id(self.directory)
        return self._install_id

    def set_client_enabled(self, enabled: bool) -> None:
        """Honour the editor's telemetry switch (VS Code's `isTelemetryEnabled`)."""
        self.settings = self.settings.model_copy(update={"client_enabled": enabled})
        self._follow_level()

    def set_level(self, level: Level) -> None:
        """Change the configured level (the configuration was re-read)."""
        self.settings = self.settings.model_copy(update={"level": level})
        self._follow_level()

    def _follow_level(self) -> None:
        # Off: nothing new is recorded and nothing spooled leaves the machine until it is on.
        if self.sender is not None:
            self.sender.set_enabled(self.level != "off")
        if self.level != "off":
            self.start()

    # -- recording --------------------------------------------------------------------------

    def record(self, event: AnyEvent) -> bool:
        """Queue `event` as the level allows; False when it was not recorded. Never blocks."""
        if self._closed:
            return False
        allowed = apply_level(event, self.level)
        if allowed is None:
            return False
        try:
            self._queue.put_nowait(allowed)
        except queue.Full:
            with self._overflow_lock:  # rare path; counted into dropped_events by the writer
                self._overflow += 1
            return False
        return True

    def flush_to_spool(self, timeout: float = 5.0) -> bool:
        """Wait until every event recorded so far is committed to the spool.

        False when that takes longer than `timeout`, or when a commit since the last flush
        failed: its events are lost (and counted in the spool's `dropped_events`).
        """
        if self._writer is None or not self._writer.is_alive():
            return self._queue.empty()
        marker = _FlushMarker()
        try:
            self._queue.put(marker, timeout=timeout)
        except queue.Full:
            return False
        return marker.done.wait(timeout) and marker.committed

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Open the spool and start the writer (and the sender when a backend is configured)."""
        with self._lock:
            if self._closed or self._writer is not None or self.level == "off":
                return
            settings = self.settings
            self.spool = Spool(
                self.directory / SPOOL_FILE,
                max_events=settings.spool_max_events,
                max_bytes=settings.spool_max_bytes,
            )
            if settings.backend_url:
                self.sender = Sender(
                    self.spool,
                    url=settings.backend_url,
                    token=settings.token,
                    batch_size=settings.batch_size,
                    flush_interval_s=settings.flush_interval_s,
                    request_timeout_s=settings.request_timeout_s,
                    retry_deadline_s=settings.retry_deadline_s,
                    backoff_initial_s=settings.backoff_initial_s,
                    backoff_max_s=settings.backoff_max_s,
                    transport=self._transport,
                    install_id=self.install_id,
                )
                self.sender.start()
            self._writer = threading.Thread(
                target=self._write_loop, name="tabloop-spool-writer", daemon=True
            )
            self._writer.start()

    def shutdown(self, timeout: float | None = None) -> bool:
        """Commit queued events, send for up to `timeout` seconds; True when nothing is left."""
        timeout = self.settings.shutdown_timeout_s if timeout is None else timeout
        with self._lock:
            if self._closed:
                return True
            self._closed = True
        if self._writer is None:
            return True
        self._queue.put(_STOP)
        self._writer.join(max(timeout, 1.0))
        drained = self.sender.shutdown(timeout) if self.sender is not None else False
        if self.spool is not None:
            self.spool.close()
        return drained

    def stats(self) -> dict[str, Any]:
        """Counters for logs and `tabloop doctor`."""
        out: dict[str, Any] = {"level": self.level, "queued": self._queue.qsize()}
        if self.spool is not None and not self._closed:
            out["spool"] = asdict(self.spool.stats())
        if self.sender is not None:
            out["sender"] = asdict(self.sender.stats)
        return out

    # -- the writer thread ----------------------------------------------------------------------

    def _write_loop(self) -> None:
        assert self.spool is not None
        stop = False
        failed = False  # a commit failed since the last flush marker was answered
        while not stop:
            items = [self._queue.get()]
            while len(items) < WRITER_BATCH:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            rows = []
            markers = []
            for item in items:
                if isinstance(item, _FlushMarker):
                    markers.append(item)
                elif isinstance(item, threading.Event):
                    stop = True  # _STOP, the only other item that is not an event
                else:
                    rows.append((str(item.event_id), item.model_dump_json().encode()))
            try:
                self.spool.append(rows)
            except Exception:
                # Disk full or locked for long: these events are lost; the spool counted them.
                failed = True
                log.exception("telemetry: could not spool %d events", len(rows))
            with self._overflow_lock:
                overflow, self._overflow = self._overflow, 0
            try:
                self.spool.add_dropped(overflow)  # kept in memory by the spool if it cannot write
            except Exception:
                log.exception("telemetry: could not count %d dropped events", overflow)
            for marker in markers:
                marker.committed = not failed
                marker.done.set()
            if markers:
                failed = False
            if self.sender is not None and self.spool.stats().events >= self.settings.batch_size:
                self.sender.wake()


class _FlushMarker:
    """A queue item the writer answers once everything queued before it was committed, or not."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.committed = True


_STOP = threading.Event()  # a queue item that tells the writer to finish
