"""Repeated inspections of an unchanged file are free: headers and analyses remembered per file version.

A file version is ``file_version(path)`` for a local file — ``(resolved path, inode, size, mtime_ns)``, so a
rewritten or replaced file is read again — and ``(endpoint, repo, commit, file, token digest)`` for a Hub file (a
commit never changes; the token is part of the key so that one visitor's access never answers for another's).
Only successful results are kept; each memo holds at most ``MEMO_ENTRIES`` entries, least recently used first out.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable

MEMO_ENTRIES = 64


class Memo:
    """A small thread-safe LRU map from a hashable key to a computed value."""

    def __init__(self, entries: int = MEMO_ENTRIES) -> None:
        self._entries = entries
        self._values: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get_or_compute(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key]
        value = compute()  # outside the lock: a slow read never blocks other files' lookups
        with self._lock:
            self._values[key] = value
            while len(self._values) > self._entries:
                self._values.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._values.clear()


def file_version(path: str | os.PathLike) -> tuple[Any, ...] | None:
    """``(resolved path, inode, size, mtime_ns)`` of an existing file; None when there is none."""
    resolved = os.path.realpath(path)
    try:
        stat = os.stat(resolved)
    except OSError:
        return None
    return resolved, stat.st_ino, stat.st_size, stat.st_mtime_ns


HEADERS = Memo()  # file version (+ adapter_config.json's) → HeaderView
ANALYSES = Memo()  # (HeaderView identity, inspection options) → Analysis


def clear() -> None:
    """Forget every remembered header and analysis (the benchmark's first-look runs use this)."""
    HEADERS.clear()
    ANALYSES.clear()
