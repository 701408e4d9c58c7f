"""The bound on a hosted visitor's cheap queued requests (inspect, listings, compare): a few waiting or running.

``Queue.push`` of Gradio refuses only when the whole queue is full, which one visitor can fill for everyone. Here a
visitor with ``LIMITS.cheap_per_visitor`` cheap events waiting or running gets its next join answered at once with
one line (``Reason.VISITOR_REQUESTS``), without entering the queue (the hook: ``ui/gradio_compat.hook_queue``).
GPU events are not counted here: they pass to their own bounded admission (``gpu_gate.py``), whose refusals are
answered at once too; off-queue events are counted while they run (``admission.InFlight``). A visitor is the keys
of ``visitors.visitor_keys``: session and address.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .gpu_gate import GPU_CONCURRENCY_ID
from .limits import LIMITS
from .refusals import Reason, why_refused
from .visitors import visitor_keys


class CheapJoinBound:
    """A ``gradio_compat.JoinGate``: at most ``limit`` cheap queued events per visitor key (the event loop's
    thread only: no lock)."""

    def __init__(self, limit: int = LIMITS.cheap_per_visitor) -> None:
        self.limit = limit
        self._events: dict[str, set[str]] = {}  # visitor key → its cheap events still in the queue

    def counts(self, join: Any) -> bool:
        return join.queued and join.concurrency_id != GPU_CONCURRENCY_ID

    def refusal(self, join: Any, waiting: Callable[[str], bool]) -> str | None:
        if not self.counts(join):
            return None
        keys = visitor_keys(join)
        for key in keys:
            self._events[key] = {i for i in self._events.get(key, ()) if waiting(i)}
            if not self._events[key]:
                del self._events[key]
        if any(len(self._events.get(key, ())) >= self.limit for key in keys):
            return why_refused(Reason.VISITOR_REQUESTS, limit=self.limit)
        return None

    def joined(self, join: Any, event_id: str) -> None:
        if self.counts(join):
            for key in visitor_keys(join):
                self._events.setdefault(key, set()).add(event_id)
