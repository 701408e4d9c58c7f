"""Normalised adapters kept in memory between jobs, least recently used first out, within a byte budget.

The key names the exact file: ``(source, revision, file, size, sha256)`` — a new commit, a re-upload or another
file of the same repo is another entry. The budget counts the bytes of the tensors held (a tensor shared by
several targets, e.g. the one ``A`` of a native fused q/k/v, counts once).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from ..adapters.types import NormalisedAdapter


@dataclass(frozen=True)
class AdapterKey:
    """One adapter file: where it came from and what it was (size in bytes, sha256 hex; either may be unknown)."""

    source: str
    revision: str | None
    file: str | None
    size: int | None
    sha256: str | None


def adapter_nbytes(adapter: NormalisedAdapter) -> int:
    """Bytes of the tensors ``adapter`` holds (main and ``transformer_ref`` modules), each storage counted once."""
    seen: set[tuple[str, int]] = set()
    total = 0
    modules = list(adapter.modules.values()) + list(adapter.reference_modules.values())
    for module in modules:
        for tensor in (module.down, module.up):
            if tensor.is_meta:
                continue
            storage = tensor.untyped_storage()
            key = (str(tensor.device), storage.data_ptr())
            if key in seen:
                continue
            seen.add(key)
            total += storage.nbytes()
    return total


class AdapterCache:
    """LRU cache of normalised adapters with a byte budget. Thread-safe (the UI and the worker may both ask)."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        self.budget_bytes = int(budget_bytes)
        self._entries: OrderedDict[AdapterKey, tuple[NormalisedAdapter, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: AdapterKey) -> bool:
        return key in self._entries

    def keys(self) -> list[AdapterKey]:
        """Least recently used first."""
        with self._lock:
            return list(self._entries)

    def get(self, key: AdapterKey) -> NormalisedAdapter | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[0]

    def put(self, key: AdapterKey, adapter: NormalisedAdapter) -> bool:
        """Hold ``adapter`` (evicting least recently used entries to fit). Returns False, holding nothing new, when
        the adapter alone is larger than the budget."""
        size = adapter_nbytes(adapter)
        with self._lock:
            if key in self._entries:
                self._bytes -= self._entries.pop(key)[1]
            if size > self.budget_bytes:
                return False
            while self._entries and self._bytes + size > self.budget_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._bytes -= evicted
            self._entries[key] = (adapter, size)
            self._bytes += size
            return True

    def get_or_load(self, key: AdapterKey, load: Callable[[], NormalisedAdapter]) -> NormalisedAdapter:
        """The cached adapter, or ``load()`` (outside the lock) then cache it."""
        cached = self.get(key)
        if cached is not None:
            return cached
        adapter = load()
        self.put(key, adapter)
        return adapter

    def pop(self, key: AdapterKey) -> NormalisedAdapter | None:
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return None
            self._bytes -= entry[1]
            return entry[0]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

