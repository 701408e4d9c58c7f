"""Disk quotas on a hosted app's upload copies: per visitor and in total, each refusal one line naming the limit.

An upload is kept once: the app moves Gradio's cached copy into its own uploads folder (each upload in its own
random folder, deleted after an hour with the results) instead of copying it; a refused upload's cached copy is
deleted at once (``discard``). A visitor's uploads are counted while their files still exist; the total is what the
uploads folder holds now. Gradio's upload cache has its own cap (``upload_cache_gb``, or ``H3APP_MAX_UPLOAD_CACHE_GB``):
files uploaded but never handed to the app cannot be charged to a visitor, so while the cache holds more than that,
new uploads are refused until Gradio's hourly clean-up (``delete_cache``) removes them. The quotas are in
``limits.py``, the refusals' words in ``refusals.py``.
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from pathlib import Path

from gradio.utils import get_upload_folder

from .limits import LIMITS
from .refusals import Reason, Refused


class UploadQuota:
    """Bytes of upload copies per visitor and in ``folder`` (thread-safe)."""

    def __init__(self, folder: str | Path, per_visitor: int, total: int, cache_cap: int | None = None) -> None:
        self.folder, self.per_visitor, self.total = Path(folder), per_visitor, total
        self.cache_cap = cache_cap if cache_cap is not None else LIMITS.upload_cache()
        self._lock = threading.Lock()
        self._files: dict[str, list[Path]] = defaultdict(list)

    def reserve(self, visitor: str, size: int) -> None:
        """Refuse an upload of ``size`` bytes that would take ``visitor`` or the folder over its quota."""
        with self._lock:
            files = [p for p in self._files[visitor] if p.is_file()]
            self._files[visitor] = files
            mine = sum(p.stat().st_size for p in files)
        if mine + size > self.per_visitor:
            raise Refused(Reason.VISITOR_UPLOADS, used=mine + size, quota=self.per_visitor)
        cached = folder_bytes(Path(get_upload_folder()))
        if cached > self.cache_cap:
            raise Refused(Reason.UPLOAD_CACHE_FULL, used=cached, quota=self.cache_cap)
        used = folder_bytes(self.folder)
        if used + size > self.total:
            raise Refused(Reason.UPLOADS_FULL, used=used, quota=self.total)

    def record(self, visitor: str, path: Path) -> None:
        with self._lock:
            self._files[visitor].append(path)


def discard(upload: Path) -> None:
    """Delete a refused upload's copy in Gradio's upload cache (and its folder, when empty) at once; a file given
    from anywhere else is left alone."""
    cache = os.path.realpath(get_upload_folder())
    real = os.path.realpath(upload)
    if not real.startswith(cache + os.sep):
        return
    Path(real).unlink(missing_ok=True)
    parent = os.path.dirname(real)
    if parent != cache and not os.listdir(parent):
        os.rmdir(parent)


def folder_bytes(folder: Path) -> int:
    """Bytes of the files directly inside ``folder``'s subfolders (the uploads layout: one folder per upload)."""
    total = 0
    if not folder.is_dir():
        return 0
    for entry in os.scandir(folder):
        if entry.is_dir(follow_symlinks=False):
            total += sum(f.stat().st_size for f in os.scandir(entry.path) if f.is_file(follow_symlinks=False))
    return total


def upload_quota(folder: str | Path, adapter_bytes: int) -> UploadQuota:
    """The hosted quotas (``limits.py``) for adapters of at most ``adapter_bytes`` each."""
    return UploadQuota(folder, LIMITS.uploads_per_visitor(adapter_bytes), LIMITS.uploads_total(adapter_bytes))
