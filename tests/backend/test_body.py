"""Request bodies are worked on off the event loop once they are large enough to matter."""

from __future__ import annotations

import threading

from backend.routes.body import INLINE_BYTES, _off_loop


async def test_only_large_bodies_leave_the_event_loop() -> None:
    loop_thread = threading.get_ident()
    assert await _off_loop(INLINE_BYTES, threading.get_ident) == loop_thread  # cheap: inline
    assert await _off_loop(INLINE_BYTES + 1, threading.get_ident) != loop_thread
