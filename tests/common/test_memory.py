"""Giving memory back: freed heap pages in pauses between pieces of work, never during one; a
mapped file's pages that were read once."""

from __future__ import annotations

import mmap
import os
import threading
from pathlib import Path

import pytest

from common.memory import (
    PRIMITIVE_CACHE_ENV,
    IdleTrim,
    bound_primitive_cache,
    can_release_pages,
    mapped_resident_kb,
    release_mapped_file,
)


def test_a_trim_follows_the_work_once_it_pauses() -> None:
    trimmed = threading.Event()
    idle = IdleTrim(delay_s=0.01, trim=trimmed.set)
    with idle.working():
        assert not idle.pending
    assert trimmed.wait(30), "no trim after the work paused"
    assert not idle.pending


def test_work_calls_off_a_waiting_trim_and_overlapping_work_waits_for_the_last() -> None:
    trims: list[int] = []
    idle = IdleTrim(delay_s=3600, trim=lambda: trims.append(1))  # never fires in this test
    with idle.working():
        pass
    assert idle.pending
    with idle.working():
        assert not idle.pending  # called off by the new work
        with idle.working():
            pass
        assert not idle.pending  # the outer piece is still under way
    assert idle.pending and trims == []


@pytest.mark.skipif(not can_release_pages(), reason="madvise(MADV_PAGEOUT): Linux 5.4 or later")
def test_a_mapped_file_read_once_gives_its_pages_back_and_keeps_its_contents(
    tmp_path: Path,
) -> None:
    data = bytes(range(256)) * (4 * 1024 * 4)  # 4 MB
    path = tmp_path / "weights.data"
    path.write_bytes(data)
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        assert mapped[:] == data  # every page read once
        assert mapped_resident_kb(path) >= 4096
        assert release_mapped_file(path) == len(data)
        assert mapped_resident_kb(path) < 1024  # given back
        assert mapped[:] == data  # and read again from the file, unchanged
    assert release_mapped_file(path) == 0  # no longer mapped


def test_the_primitive_cache_bound_is_set_unless_the_environment_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(PRIMITIVE_CACHE_ENV, raising=False)
    assert bound_primitive_cache(64) == 64
    assert os.environ[PRIMITIVE_CACHE_ENV] == "64"
    monkeypatch.setenv(PRIMITIVE_CACHE_ENV, "512")
    assert bound_primitive_cache(64) == 512
    assert os.environ[PRIMITIVE_CACHE_ENV] == "512"
    monkeypatch.setenv(PRIMITIVE_CACHE_ENV, "lots")
    assert bound_primitive_cache(64) is None
