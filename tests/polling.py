"""Waiting in tests: every poll has a deadline, so a job that never starts fails its test with a line saying what
it waited for, instead of hanging the suite until pytest-timeout's per-test limit (pytest.ini) stops it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

POLL_SECONDS = 120.0  # the longest a test waits for a job to reach a state on a loaded 2-core machine


def wait_until(condition: Callable[[], Any], what: str, seconds: float = POLL_SECONDS, *,
               wait: Callable[[float], Any] = time.sleep, step: float = 0.05) -> None:
    """Return once ``condition()`` is true; fail after ``seconds`` naming ``what``. ``wait(step)`` runs between polls
    (``time.sleep``; a job handle's ``wait_for_change`` returns early when its progress moves)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {seconds:g} s for {what}")
        wait(step)
