"""The one table of a server's limits on shared work: how deep each queue is, each visitor's share, and the disk
uploads may take. Every bound of the hosting room (and the worker's line) is read from :data:`LIMITS`; the two disk
quotas and the download cache's budget can be set from the environment (read when a server builds them, as
``README.md`` lists). The size cap of one adapter file is the adapter sources' rule (``adapters.source.limits``:
``H3APP_MAX_ADAPTER_MB``, 2,000 MB on a hosted server), since the CLI applies it too.

The three lines a job passes, outermost first: Gradio's queue (``gradio_queue``: cheap events waiting for their own
slots; hosted GPU events do not wait there), the admission (``gpu_pending`` GPU jobs waiting or running in all,
``gpu_per_visitor`` each), and the worker's line (``worker_line``, the jobs queued on the one GPU worker; the
admission is never larger).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

GB = 1024**3
UPLOADS_GB_ENV = "H3APP_MAX_UPLOADS_GB"  # the total quota of upload copies, in GB
UPLOAD_CACHE_GB_ENV = "H3APP_MAX_UPLOAD_CACHE_GB"  # Gradio's upload cache, in GB
DOWNLOAD_CACHE_GB_ENV = "H3APP_MAX_DOWNLOAD_CACHE_GB"  # the Hugging Face cache's adapter downloads, in GB


@dataclass(frozen=True)
class HostingLimits:
    """The limits of one server (counts; seconds; GB)."""

    gradio_queue: int = 64  # hosted: cheap events waiting in Gradio's queue for their own slots
    worker_line: int = 16  # jobs queued on the GPU worker (a local app's Gradio queue has the same bound)
    gpu_pending: int = 8  # one worker: the 8th job waits for 7 (≈ 7 min at 544p on one GPU); 8 threads of Gradio's 40
    gpu_per_visitor: int = 2  # one running and one waiting: a visitor can queue their next request, not a batch
    refusal_slots: int = 4  # Gradio slots of GPU events kept free so that a refusal is answered in milliseconds
    cheap_per_visitor: int = 3  # queued cheap events (inspect, upload, compare) one visitor may have waiting or running
    off_queue_per_visitor: int = 8  # off-queue events (readouts, notes) running at once: a page load fires several
    abandon_seconds: float = 5.0  # a join whose event stream is not open by then counts as abandoned
    adapters_per_visitor: int = 2  # upload quota per visitor: the two adapter slots, each up to the adapter size cap
    upload_visitors: int = 8  # the total upload quota: this many visitors' full quotas (UPLOADS_GB_ENV overrides)
    upload_cache_gb: float = 32.0  # Gradio's upload cache: the total quota at the default 2,000 MB adapter cap
    download_cache_gb: float = 20.0  # hosted: adapter downloads in the Hugging Face cache (LRU, never the model)
    grid_cells: int = 16  # hosted: cells of one grid (each a full generation; 16 at 544p ≈ 16 min on one GPU)
    grid_rows: int = 8  # hosted: adapter rows of one grid (a glob's files): each row is at least one cell per column

    def uploads_per_visitor(self, adapter_bytes: int) -> int:
        """Bytes of upload copies one visitor may keep, for adapters of at most ``adapter_bytes`` each."""
        return self.adapters_per_visitor * adapter_bytes

    def uploads_total(self, adapter_bytes: int) -> int:
        """Bytes the uploads folder may hold: ``H3APP_MAX_UPLOADS_GB``, else ``upload_visitors`` full quotas."""
        total_gb = os.environ.get(UPLOADS_GB_ENV)
        return int(float(total_gb) * GB) if total_gb else self.upload_visitors * self.uploads_per_visitor(adapter_bytes)

    def upload_cache(self) -> int:
        """Bytes Gradio's upload cache may hold before new uploads are refused: ``H3APP_MAX_UPLOAD_CACHE_GB``, else
        ``upload_cache_gb``."""
        return int(float(os.environ.get(UPLOAD_CACHE_GB_ENV) or self.upload_cache_gb) * GB)

    def download_cache(self, hosted: bool) -> int | None:
        """Bytes of adapter downloads the Hub cache may keep: ``H3APP_MAX_DOWNLOAD_CACHE_GB``, else
        ``download_cache_gb`` on a hosted server and no budget on a local one (None)."""
        cache_gb = os.environ.get(DOWNLOAD_CACHE_GB_ENV)
        return int(float(cache_gb) * GB) if cache_gb else (int(self.download_cache_gb * GB) if hosted else None)


LIMITS = HostingLimits()
