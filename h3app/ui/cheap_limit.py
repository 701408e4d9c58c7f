"""The bound on a hosted visitor's cheap requests (inspect, listings, readouts, compare): a few in flight at once.

Queued cheap events are counted when they join Gradio's queue (``queue_hooks.py``), so that one visitor's flood
never fills the queue for everyone; events that run off the queue (``queue=False``) are counted here while they
run (``endpoint_guard.py``). Either way a visitor over the bound is answered at once with :func:`refusal`, and a
visitor is the same keys the GPU admission uses (``fair_queue.visitor_keys``: session and address).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from ..backend.admission import KeyCounts

CHEAP_PER_VISITOR = 3  # queued cheap events (inspect, upload, compare) one visitor may have waiting or running
OFF_QUEUE_PER_VISITOR = 8  # off-queue events (readouts, notes) running at once: a page load fires several; 40 threads


def refusal(limit: int = CHEAP_PER_VISITOR) -> str:
    return (f"you already have {limit} requests waiting or running (at most {limit} per visitor): wait for their "
            f"answers, then try again.")


class InFlight:
    """Counts running requests per visitor key (thread-safe)."""

    def __init__(self, limit: int = OFF_QUEUE_PER_VISITOR) -> None:
        self.limit = limit
        self._lock = threading.Lock()
        self._held = KeyCounts()

    def acquire(self, keys: Sequence[str]) -> bool:
        """Hold one for ``keys``; False (nothing held) when any key is at the limit."""
        with self._lock:
            if self._held.at_limit(keys, self.limit):
                return False
            self._held.add(keys)
            return True

    def release(self, keys: Sequence[str]) -> None:
        with self._lock:
            self._held.remove(keys)
