"""The LSP base protocol's framing (`Content-Length` headers, then a body), read defensively.

pygls's own reader (`pygls.io_.run_async`) trusts every frame: a header it cannot match is
skipped in silence, a wrong `Content-Length` leaves it reading the next frame as this one's
body, and an enormous one is allocated at once. This reader replaces it for stdio and TCP. Its
rules, which docs/editors.md repeats for client authors:

- Header names are case-insensitive (`content-length` is accepted), as in HTTP, whose header
  syntax the LSP base protocol borrows; other headers (`Content-Type`) are read and ignored.
- Lines may end in CRLF or a bare LF.
- A frame without a readable `Content-Length` is answered with one parse error (-32700, id
  null); so is a run of bytes that is not a frame at all. Reading then resynchronises on the
  next `Content-Length` header, which may start mid-line (a body cut short runs straight into
  the next frame's header).
- A body longer than `max_bytes` (the `maxMessageBytes` setting) is answered with an invalid
  request error (-32600, id null) and skipped without being kept.
- A body that a `Content-Length` header interrupts, or that stalls for `STALL_SECONDS` after a
  complete JSON value, had a declared length longer than the message: it is answered with an
  invalid request error, with the id when the JSON holds one, and reading goes on at the
  header. A valid JSON text can never contain such a header line, because JSON strings cannot
  hold a raw line break, so a correct frame is never cut.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600

CHUNK_BYTES = 64 * 1024
# A header line longer than this is garbage; its tail is kept in case a header starts there.
MAX_HEADER_LINE = 8 * 1024
HEADER_TAIL = 64
STALL_SECONDS = 0.5

# Where a frame can start: the name of the one header that matters, at any position in a line.
HEADER_START = re.compile(rb"content-length[ \t]*:", re.IGNORECASE)
# A complete length header; inside a body it means the declared length was too long.
LENGTH_LINE = re.compile(rb"content-length[ \t]*:[ \t]*\d+[ \t]*\r?\n", re.IGNORECASE)
HEADER_LINE = re.compile(rb"^([!#$%&'*+.^_`|~0-9A-Za-z-]+)[ \t]*:[ \t]*(.*?)[ \t]*\r?\n?$")

ChunkSource = Callable[[], Awaitable[bytes]]


@dataclass(frozen=True)
class Body:
    """A frame's body, exactly as long as its `Content-Length` said."""

    data: bytes


@dataclass(frozen=True)
class Refusal:
    """A frame that cannot be handled, answered with this error (`msg_id` None: id null)."""

    code: int
    message: str
    msg_id: int | str | None = None


Frame = Body | Refusal


def readable_id(data: Any) -> int | str | None:
    """The id of a JSON-RPC message when it is one LSP allows (integer or string), else None."""
    if isinstance(data, dict):
        msg_id = data.get("id")
        if isinstance(msg_id, str) or (isinstance(msg_id, int) and not isinstance(msg_id, bool)):
            return msg_id
    return None


class FrameReader:
    """Frames from a byte stream; `read_chunk` returns the next bytes, b"" at the end."""

    def __init__(self, read_chunk: ChunkSource, max_bytes: Callable[[], int]) -> None:
        self._read_chunk = read_chunk
        self._max_bytes = max_bytes
        self._buffer = bytearray()
        self._eof = False
        # True while skipped bytes need no answer of their own: they follow a refused frame,
        # or their run was answered already.
        self._quiet = False

    def refused(self) -> None:
        """The last body was answered with an error: skipped bytes after it are its tail."""
        self._quiet = True

    async def frames(self) -> AsyncIterator[Frame]:
        """Every frame until the stream ends."""
        while True:
            frame = await self._next()
            if frame is None:
                return
            yield frame

    async def _fill(self, timeout: float | None = None) -> bool:
        """Append the next chunk; False at the end of the stream."""
        if self._eof:
            return False
        if timeout is None:
            chunk = await self._read_chunk()
        else:
            chunk = await asyncio.wait_for(self._read_chunk(), timeout)
        if not chunk:
            self._eof = True
            return False
        self._buffer += chunk
        return True

    async def _line(self) -> bytes | None:
        """The next line with its ending, a piece of an overlong one, or None at the end."""
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                return self._take(end + 1)
            if len(self._buffer) > MAX_HEADER_LINE:
                return self._take(len(self._buffer) - HEADER_TAIL)
            if not await self._fill():
                return self._take(len(self._buffer)) if self._buffer else None

    def _take(self, count: int) -> bytes:
        taken = bytes(self._buffer[:count])
        del self._buffer[:count]
        return taken

    def _skipped(self, garbage: bytes) -> Refusal | None:
        """Bytes outside any frame: logged, and answered once per run."""
        log.warning("skipped %d bytes that are not an LSP frame: %r", len(garbage), garbage[:80])
        if self._quiet:
            return None
        self._quiet = True
        return Refusal(PARSE_ERROR, "bytes outside a Content-Length frame were skipped")

    async def _next(self) -> Frame | None:
        headers: dict[str, bytes] = {}
        while True:
            line = await self._line()
            if line is None:
                return None
            if not headers:
                if not line.strip():
                    continue  # blank lines between frames are harmless
                start = HEADER_START.search(line)
                if start is None and HEADER_LINE.match(line) is None:
                    if (refusal := self._skipped(line)) is not None:
                        return refusal
                    continue
                if start is not None and start.start() > 0:
                    # A frame starts mid-line: the bytes before it are not one.
                    self._buffer[:0] = line[start.start() :]
                    if (refusal := self._skipped(line[: start.start()])) is not None:
                        return refusal
                    continue
            elif not line.strip():
                return await self._frame(headers)
            header = HEADER_LINE.match(line)
            if header is None:
                # Not a header inside a header block: drop the block, look again from here.
                self._buffer[:0] = line
                headers.clear()
                if (refusal := self._skipped(b"a broken header block")) is not None:
                    return refusal
                continue
            headers[header.group(1).decode("ascii").lower()] = header.group(2)

    async def _frame(self, headers: dict[str, bytes]) -> Frame | None:
        """The body that a complete header block announces, or why there is none."""
        length_text = headers.get("content-length")
        if length_text is None or not length_text.isdigit():
            self._quiet = True
            shown = "missing" if length_text is None else repr(length_text.decode("latin-1"))
            log.warning("refused a frame: Content-Length is %s", shown)
            return Refusal(PARSE_ERROR, f"a frame's Content-Length is {shown}")
        # Past 18 digits the number only matters as "too long" (and int() refuses 4300+).
        length = int(length_text) if len(length_text) <= 18 else sys.maxsize
        limit = self._max_bytes()
        if length > limit:
            log.warning("skipping a %d-byte message (maxMessageBytes is %d)", length, limit)
            self._quiet = True
            await self._skip(length)
            return Refusal(
                INVALID_REQUEST, f"a {length}-byte message exceeds maxMessageBytes ({limit})"
            )
        body, cut = await self._body(length)
        if body is None:
            return None
        if cut:
            self._quiet = True
            log.warning("Content-Length %d ran past a %d-byte message", length, len(body))
            try:
                msg_id = readable_id(json.loads(body))
            except (ValueError, RecursionError):
                msg_id = None
            return Refusal(
                INVALID_REQUEST,
                f"Content-Length {length} is longer than the {len(body)}-byte message",
                msg_id,
            )
        self._quiet = False
        return Body(body)

    async def _body(self, length: int) -> tuple[bytes | None, bool]:
        """(body, cut short): the body, or the bytes before a header that interrupts it."""
        scanned = 0
        while True:
            interrupt = LENGTH_LINE.search(
                self._buffer, max(0, scanned - HEADER_TAIL), length + HEADER_TAIL
            )
            if interrupt is not None and interrupt.start() < length:
                return self._take(interrupt.start()), True
            if len(self._buffer) >= length:
                return self._take(length), False
            scanned = len(self._buffer)
            try:
                if not await self._fill(STALL_SECONDS):
                    return None, False
            except TimeoutError:
                if complete_json(self._buffer):
                    return self._take(len(self._buffer)), True

    async def _skip(self, length: int) -> None:
        """Discard `length` bytes, keeping none of them; stop early at a length header."""
        left = length
        while True:
            interrupt = LENGTH_LINE.search(
                self._buffer, 0, min(left, sys.maxsize - HEADER_TAIL) + HEADER_TAIL
            )
            if interrupt is not None and interrupt.start() < left:
                del self._buffer[: interrupt.start()]
                return
            if len(self._buffer) >= left:
                del self._buffer[:left]
                return
            # The last bytes stay: a header may begin there and end in the next chunk.
            drop = max(0, len(self._buffer) - HEADER_TAIL)
            del self._buffer[:drop]
            left -= drop
            if not await self._fill():
                self._buffer.clear()
                return


def complete_json(data: bytes | bytearray) -> bool:
    """Whether `data` is one whole JSON value (so more bytes can only be a framing error)."""
    try:
        json.loads(data)
    except (ValueError, RecursionError):
        return False
    return True


async def serve_frames(
    read_chunk: ChunkSource,
    max_bytes: Callable[[], int],
    receive: Callable[[bytes], bool],
    refuse: Callable[[Refusal], None],
    stopped: Callable[[], bool],
) -> None:
    """Hand each body to `receive` and each refusal to `refuse` until the stream ends.

    `receive` returns False when it answered the body with an error; bytes that follow it
    before the next frame are then taken as its tail and not answered again.
    """
    reader = FrameReader(read_chunk, max_bytes)
    async for frame in reader.frames():
        try:
            if isinstance(frame, Refusal):
                refuse(frame)
            elif not receive(frame.data):
                reader.refused()
        except Exception:
            # One message must never end the connection; `receive` answers what it can.
            log.exception("could not handle a message")
            reader.refused()
        if stopped():
            return
