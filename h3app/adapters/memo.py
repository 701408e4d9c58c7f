"""Repeated inspections of an unchanged file are free: headers and analyses remembered per file version.

A file version is ``file_version(path)`` for a local file — ``(resolved path, inode, size, mtime_ns)``, so a
rewritten or replaced file is read again — and ``(endpoint, repo, commit, file, token digest)`` for a Hub file (a
commit never changes; the token is part of the key so that one visitor's access never answers for another's).
Only successful results are kept; each memo holds at most ``MEMO_ENTRIES`` entries, least recently used first out.
"""

from __future__ import annotations

import os
from typing import Any

from ..lru import LRU

MEMO_ENTRIES = 64


def file_version(path: str | os.PathLike) -> tuple[Any, ...] | None:
    """``(resolved path, inode, size, mtime_ns)`` of an existing file; None when there is none."""
    resolved = os.path.realpath(path)
    try:
        stat = os.stat(resolved)
    except OSError:
        return None
    return resolved, stat.st_ino, stat.st_size, stat.st_mtime_ns


HEADERS: LRU[Any, Any] = LRU(MEMO_ENTRIES)  # file version (+ adapter_config.json's) → HeaderView
ANALYSES: LRU[Any, Any] = LRU(MEMO_ENTRIES)  # (HeaderView identity, inspection options) → Analysis


def clear() -> None:
    """Forget every remembered header and analysis (the benchmark's first-look runs use this)."""
    HEADERS.clear()
    ANALYSES.clear()
