"""What this package uses of the app's ``Backend`` (``h3app.backend.service``), which it may not import: the
structural type the entry points' Backend satisfies (the type checker holds the two together where they pass one)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..model.loader import LoadedModel


class RankBackend(Protocol):
    """One rank's Backend: its held model, the wrapper every job goes through, its output folder, and the two calls
    that queue a job and wait for it."""

    model: LoadedModel
    output_dir: Path
    wrap_job: Callable[[Any, Any], Any]  # backend.worker.JobWrapper: (job, JobCall) → the job as queued

    def submit_job(self, job: Callable[[Any], Any], label: str, again: Callable[[Any], Any],
                   workflow: str = ...) -> Any:
        """Queue ``job`` through ``wrap_job``; ``again(backend)`` queues the same job on another rank."""
        ...

    def run(self, handle: Any) -> Any:
        """Wait for a queued job; its result, or its error raised."""
        ...
