"""Admission of GPU jobs on a public server: a bounded number waiting or running, at most a few per visitor.

The worker runs one job at a time in order; this bound is what keeps one visitor (or one address opening many
sessions) from filling the line ahead of everyone else. A job is *held* from the moment its event starts until its
answer is back, and refused at once — one line naming the limit — when its visitor, or the server, is at the bound.
The UI decides who a visitor is (``h3app.ui.fair_queue``); here a visitor is a set of keys, each with the same
per-visitor limit.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

from ..errors import H3AppError

MAX_PENDING = 8  # one worker: the 8th job waits for 7 (≈ 7 min at 544p on one GPU); 8 threads of Gradio's 40
PER_VISITOR = 2  # one running and one waiting: a visitor can queue their next request, not a batch
OWNER: ContextVar[str | None] = ContextVar("h3app_job_owner", default=None)  # whose jobs the worker queues now


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


class Refused(H3AppError):
    """A GPU job not admitted: its visitor or the server is at the bound."""


class Admission:
    """Counts held GPU jobs per visitor key and in total (thread-safe)."""

    def __init__(self, max_pending: int = MAX_PENDING, per_visitor: int = PER_VISITOR) -> None:
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
                raise Refused(f"you already have {self.per_visitor} jobs waiting or running (at most "
                              f"{self.per_visitor} per visitor): wait for one to finish, or cancel it.")
            if self._total >= self.max_pending:
                raise Refused(f"the server is busy: {self.max_pending} jobs are waiting or running (its limit): "
                              f"try again in a minute.")
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
