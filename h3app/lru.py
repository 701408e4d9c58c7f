"""The one least-recently-used map of the package: the adapter cache (a byte budget), the sub-block output caches and the
inspection memos (an entry budget) are each an :class:`LRU` with their own key and cost.

Neutral on purpose (imports nothing from h3app and nothing heavy), so ``adapters``, ``lora`` and ``model`` can all
build on it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
_MISSING = object()


def one_unit(value: object) -> int:
    """The cost of an entry when the budget counts entries."""
    return 1


class LRU(Generic[K, V]):
    """Thread-safe map holding at most ``budget`` units, each value costing ``cost(value)`` units (default: 1, so
    ``budget`` counts entries), least recently used first out. ``hits``/``misses`` count lookups."""

    def __init__(self, budget: int, cost: Callable[[V], int] = one_unit) -> None:
        if budget < 0:
            raise ValueError(f"an LRU budget must be >= 0, got {budget}")
        self.budget = int(budget)
        self._cost = cost
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def held(self) -> int:
        """Units held now (bytes for a byte budget, entries otherwise)."""
        return self._held

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def keys(self) -> list[K]:
        """Least recently used first."""
        with self._lock:
            return list(self._entries)

    def _lookup(self, key: K) -> object:
        """The value (now most recently used) or ``_MISSING``, counted as a hit or a miss. Caller holds the lock."""
        entry = self._entries.get(key)
        if entry is None:
            self.misses += 1
            return _MISSING
        self._entries.move_to_end(key)
        self.hits += 1
        return entry[0]

    def get(self, key: K) -> V | None:
        with self._lock:
            found = self._lookup(key)
        return None if found is _MISSING else found  # type: ignore[return-value]

    def put(self, key: K, value: V) -> bool:
        """Hold ``value`` (evicting least recently used entries to fit). Returns False, holding nothing for ``key``,
        when the value alone is over the budget."""
        size = self._cost(value)  # outside the lock: measuring may walk tensors
        with self._lock:
            if key in self._entries:
                self._held -= self._entries.pop(key)[1]
            if size > self.budget:
                return False
            while self._entries and self._held + size > self.budget:
                self._held -= self._entries.popitem(last=False)[1][1]
            self._entries[key] = (value, size)
            self._held += size
            return True

    def get_or_compute(self, key: K, compute: Callable[[], V]) -> V:
        """The held value, or ``compute()`` (outside the lock: a slow read never blocks other lookups), then held."""
        with self._lock:
            found = self._lookup(key)
        if found is not _MISSING:
            return found  # type: ignore[return-value]
        value = compute()
        self.put(key, value)
        return value

    def pop(self, key: K) -> V | None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return None
            self._held -= entry[1]
            return entry[0]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._held = 0
