"""Admission on a public server: held requests counted per visitor and in total, refused at once at a bound.

The worker runs one job at a time; the GPU admission (:class:`Admission`) is what keeps one visitor (or one
address opening many sessions) from filling the line ahead of everyone else. A job is *held* from the moment its
event starts until its answer is back, and refused at once — one line naming the limit (``refusals.py``) — when its
visitor, or the server, is at the bound. Off-queue requests are counted the same way per visitor
(:class:`InFlight`). Who a visitor is: ``visitors.py``; here a visitor is a set of keys, each with the same limit.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

from .limits import LIMITS
from .refusals import Reason, Refused

OWNER: ContextVar[str | None] = ContextVar("h3app_job_owner", default=None)  # whose jobs the worker queues now

__all__ = ["OWNER", "Admission", "InFlight", "KeyCounts", "Refused"]


class KeyCounts:
    """How many holds each visitor key has; keys with none are forgotten. Not locked: its owner holds a lock."""

    def __init__(self) -> None:
        self._held: Counter[str] = Counter()

    def at_limit(self, keys: Sequence[str], limit: int) -> bool:
        """Whether any of ``keys`` already has ``limit`` holds."""
        return any(self._held[key] >= limit for key in keys)

    def add(self, keys: Sequence[str]) -> None:
        self._held.update(keys)

    def remove(self, keys: Sequence[str]) -> None:
        self._held.subtract(keys)
        for key in keys:
            if self._held[key] <= 0:
                self._held.pop(key, None)


class Admission:
    """Counts held GPU jobs per visitor key and in total (thread-safe)."""

    def __init__(self, max_pending: int = LIMITS.gpu_pending, per_visitor: int = LIMITS.gpu_per_visitor) -> None:
        self.max_pending, self.per_visitor = max_pending, per_visitor
        self._lock = threading.Lock()
        self._held = KeyCounts()
        self._total = 0

    @property
    def total(self) -> int:
        return self._total

    def acquire(self, keys: Sequence[str]) -> None:
        """Hold one slot for the visitor ``keys``; :class:`Refused` at once when any key or the total is at its
        bound. Every acquire is followed by one :meth:`release` of the same keys."""
        with self._lock:
            if self._held.at_limit(keys, self.per_visitor):
                raise Refused(Reason.VISITOR_JOBS, limit=self.per_visitor)
            if self._total >= self.max_pending:
                raise Refused(Reason.SERVER_BUSY, limit=self.max_pending)
            self._held.add(keys)
            self._total += 1

    def release(self, keys: Sequence[str]) -> None:
        with self._lock:
            self._held.remove(keys)
            self._total -= 1

    @contextmanager
    def hold(self, keys: Sequence[str]) -> Iterator[None]:
        """:meth:`acquire` for the duration of the block."""
        self.acquire(keys)
        try:
            yield
        finally:
            self.release(keys)


class InFlight:
    """Counts running off-queue requests per visitor key (thread-safe)."""

    def __init__(self, limit: int = LIMITS.off_queue_per_visitor) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._held = KeyCounts()

    def acquire(self, keys: Sequence[str]) -> None:
        """Hold one for ``keys``; :class:`Refused` (nothing held) when any key is at the limit."""
        with self._lock:
            if self._held.at_limit(keys, self.limit):
                raise Refused(Reason.VISITOR_REQUESTS, limit=self.limit)
            self._held.add(keys)

    def release(self, keys: Sequence[str]) -> None:
        with self._lock:
            self._held.remove(keys)
