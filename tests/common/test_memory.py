"""Giving freed heap pages back: in pauses between pieces of work, never during one."""

from __future__ import annotations

import threading

from common.memory import IdleTrim


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
