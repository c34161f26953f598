"""A check of a SQLite write-ahead log that finds committed transactions SQLite would discard.

SQLite recovers a WAL by reading frames until the first one whose checksum or salt does not
match, and silently forgets everything after it: one damaged byte in an early frame costs every
transaction committed after it, and nothing is reported. This module reads the log the same way
(https://www.sqlite.org/fileformat.html#the_write_ahead_log) and also looks past the first bad
frame: frames there that carry the log's salts and a commit mark are committed transactions
that recovery is about to drop. Frames with other salts are left over from an earlier generation
of the log (after a checkpoint) and are not a loss.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

WAL_MAGIC = (0x377F0682, 0x377F0683)  # the low bit says the checksums are big-endian
HEADER_BYTES = 32
FRAME_HEADER_BYTES = 24
_MASK = 0xFFFFFFFF


@dataclass(frozen=True)
class WalDamage:
    """Committed transactions a WAL holds that SQLite's recovery will discard."""

    salts: int  # the log generation's two salts as one number: the same damage is counted once
    first_bad_frame: int  # 0-based; -1 when the log header itself is damaged
    lost_commits: int  # commit frames at or after the first bad frame
    lost_bytes: int  # from the first bad frame to the end of the last lost commit


def _checksum(data: bytes, s0: int, s1: int, big_endian: bool) -> tuple[int, int]:
    # SQLite's WAL checksum: Fibonacci-weighted sums of 32-bit word pairs, carried from frame
    # to frame. `data` is a multiple of 8 bytes.
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & _MASK
        s1 = (s1 + words[i + 1] + s0) & _MASK
    return s0, s1


def _lost_after(data: bytes, start: int, frame_bytes: int, salts: tuple[int, int]) -> list[int]:
    """Offsets of the frames from `start` on that carry `salts` and a commit mark."""
    commits = []
    for offset in range(start, len(data) - frame_bytes + 1, frame_bytes):
        _page, commit, salt1, salt2 = struct.unpack_from(">4I", data, offset)
        if commit and (salt1, salt2) == salts:
            commits.append(offset)
    return commits


def scan_wal(path: Path) -> WalDamage | None:
    """The damage in the WAL at `path`, or None when SQLite will recover all it committed.

    Call it while holding the database's write lock, so no writer changes the log meanwhile.
    """
    try:
        data = path.read_bytes()
    except OSError:  # no log (the usual case after a clean close), or none we may read
        return None
    if len(data) < HEADER_BYTES:
        return None
    magic, _version, page_size, _ckpt, salt1, salt2, c0, c1 = struct.unpack_from(">8I", data)
    if magic not in WAL_MAGIC or page_size & (page_size - 1) or not 512 <= page_size <= 65536:
        return None  # not a log of ours, or one never written past its header
    big_endian = bool(magic & 1)
    frame_bytes = FRAME_HEADER_BYTES + page_size
    salts = (salt1, salt2)
    s0, s1 = _checksum(data[:24], 0, 0, big_endian)
    if (s0, s1) != (c0, c1):
        # A damaged header voids the whole log. Count it only when the first frame carries the
        # header's salts: a header torn while a new generation began is followed by old frames.
        if len(data) < HEADER_BYTES + frame_bytes:
            return None
        if struct.unpack_from(">2I", data, HEADER_BYTES + 8) != salts:
            return None
        return _damage(data, HEADER_BYTES, -1, frame_bytes, salts)
    offset, frame = HEADER_BYTES, 0
    while offset + frame_bytes <= len(data):
        page, _commit, fs1, fs2, f0, f1 = struct.unpack_from(">6I", data, offset)
        if (fs1, fs2) != salts:
            return None  # the rest is an earlier generation of the log
        s0, s1 = _checksum(data[offset : offset + 8], s0, s1, big_endian)
        s0, s1 = _checksum(
            data[offset + FRAME_HEADER_BYTES : offset + frame_bytes], s0, s1, big_endian
        )
        if page == 0 or (s0, s1) != (f0, f1):
            return _damage(data, offset, frame, frame_bytes, salts)
        offset, frame = offset + frame_bytes, frame + 1
    return None


def _damage(
    data: bytes, offset: int, frame: int, frame_bytes: int, salts: tuple[int, int]
) -> WalDamage | None:
    commits = _lost_after(data, offset, frame_bytes, salts)
    if not commits:
        return None  # a torn, uncommitted tail: nothing that was committed is lost
    return WalDamage(
        salts=((salts[0] << 32) | salts[1]) & 0x7FFF_FFFF_FFFF_FFFF,  # fits SQLite's INTEGER
        first_bad_frame=frame,
        lost_commits=len(commits),
        lost_bytes=commits[-1] + frame_bytes - offset,
    )
