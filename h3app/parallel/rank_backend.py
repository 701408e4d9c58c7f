"""What this package uses of the app's ``Backend`` (``h3app.backend.service``) and of its jobs
(``h3app.backend.jobs``), which it may not import: the structural types the entry points' Backend and every job value
satisfy (the type checker holds them together where they pass one)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..model.loader import LoadedModel


class RankJob(Protocol):
    """A job value (``backend.jobs.Job``): picklable, so rank 0 announces it and every follower queues it; its
    ``workflow`` names the transformer partition it runs."""

    @property
    def label(self) -> str: ...

    @property
    def workflow(self) -> str: ...

    # Declared only so that every job value is a RankJob; this package never calls it (the worker does). Its
    # parameters are backend/'s own types (``worker.JobContext``, ``job_backend.JobBackend``, ``jobs.Sinks``), which
    # this package may not import, and a narrower type here would make the jobs that take them not RankJobs.
    def run(self, ctx: Any, backend: Any, sinks: Any = ...) -> Any: ...


class RankBackend(Protocol):
    """One rank's Backend: its held model, the wrapper every job goes through, its output folder, and the two calls
    that queue a job and wait for it."""

    model: LoadedModel
    output_dir: Path
    wrap_job: Callable[[Any, Any, Any], Any]  # backend.jobs.JobWrapper: (job, sinks, its run here) → what is queued

    def submit(self, job: RankJob) -> Any:
        """Queue ``job`` (a :class:`RankJob`) through ``wrap_job``; its handle."""
        ...

    def run(self, handle: Any) -> Any:
        """Wait for a queued job; its result, or its error raised."""
        ...
