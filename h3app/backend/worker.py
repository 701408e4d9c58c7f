"""One worker thread owns the GPU: a bounded line of jobs, per-step progress, cancel between steps.

The line is round-robin across owners (a hosted app's visitors, ``hosting.admission.OWNER``, set by
``hosting.gpu_gate`` while it holds a visitor's GPU event): the next job is the oldest one of the owner served
longest ago, so a visitor who queued first never makes a later visitor wait for all of theirs. Jobs without an
owner share one. The line's bound is ``hosting.limits.LIMITS.worker_line``.

The worker runs a function of a :class:`JobContext`: a job value's run on the Backend (``jobs``, through the
Backend's job wrapper), which carries everything it needs (its request and adapter settings), so two users never see
each other's sliders (docs/architecture.md, decision 7). After a cancel or any exception the worker calls
``on_failure`` (which resets the adapters to the bitwise base) and serves the next job.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import H3AppError
from ..hosting.admission import OWNER
from ..hosting.limits import LIMITS
from ..hosting.refusals import Reason, Refused

CLIENT_GONE = "cancelled (the client went away)"
POLL_SECONDS = 0.25  # how often a waiting caller looks at progress and at its client


class QueueFull(Refused):
    """The worker's line is at its bound."""


class Cancelled(H3AppError):
    """A job stopped at a denoising step boundary after ``done`` of ``total`` steps (None: before it started).
    ``why`` says who asked: the person (a cancel) or nobody left to wait (the client went away)."""

    def __init__(self, done: int | None = None, total: int | None = None, why: str = "cancelled") -> None:
        self.done, self.total, self.why = done, total, why
        super().__init__(f"{why} before it started." if done is None else f"{why} after {done} of {total} steps.")


@dataclass
class Progress:
    """Where a job is: ``done`` of ``total`` steps in its current ``phase``."""

    done: int = 0
    total: int = 0
    phase: str = "queued"
    position: int = 0


def _as_asked(asked: bool) -> bool:
    return asked


@dataclass
class JobContext:
    """Handed to a running job: report progress, ask whether to stop. ``decide_cancel`` turns the job's own cancel
    flag into the decision (several ranks: an agreement, so that all stop at the same step)."""

    handle: JobHandle
    decide_cancel: Callable[[bool], bool] = _as_asked

    def on_step(self, done: int, total: int) -> None:
        self.handle._progress.done, self.handle._progress.total = done, total
        self.handle._notify()

    def set_phase(self, phase: str) -> None:
        self.handle._progress.phase = phase
        self.handle._notify()

    def should_cancel(self) -> bool:
        return self.decide_cancel(self.handle._cancel.is_set())


@dataclass(eq=False)
class JobHandle:
    """What a submitter holds: progress, cancel, and the result (or the error) once done."""

    id: int
    label: str
    run: Callable[[JobContext], Any]
    _progress: Progress = field(default_factory=Progress)
    _cancel: threading.Event = field(default_factory=threading.Event)
    _cancel_reason: str = "cancelled"
    _done: threading.Event = field(default_factory=threading.Event)
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _result: Any = None
    _error: BaseException | None = None
    submitted_at: float = field(default_factory=time.monotonic)
    owner: str | None = None

    @property
    def progress(self) -> Progress:
        return Progress(**vars(self._progress))

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def cancel_reason(self) -> str | None:
        """Why the job was asked to stop (``"cancelled"``, :data:`CLIENT_GONE`), None while nobody asked."""
        return self._cancel_reason if self._cancel.is_set() else None

    def cancel(self, reason: str = "cancelled") -> None:
        """Ask the job to stop at its next denoising step (or not to start, if still queued); its error then says
        ``"<reason> after k of n steps."``."""
        if not self._cancel.is_set():
            self._cancel_reason = reason
        self._cancel.set()
        self._notify()

    def cancel_if(self, abandoned: Callable[[], bool] | None) -> bool:
        """Cancel when ``abandoned()`` says nobody waits for the result any more (a client that went away: the UI
        passes the Gradio event's own check, ``h3app.ui.gradio_compat.client_gone``). Returns whether it did."""
        if abandoned is None or self.done or not abandoned():
            return False
        self.cancel(CLIENT_GONE)
        return True

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the job; return its result or raise its error."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"job {self.id} ({self.label}) is still running")
        if self._error is not None:
            raise self._error
        return self._result

    def wait_for_change(self, timeout: float = 0.5) -> None:
        """Block until progress changes or the job ends (or ``timeout`` seconds pass)."""
        with self._changed:
            if not self._done.is_set():
                self._changed.wait(timeout)

    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self._progress.phase = "failed" if error is not None else "done"
        self._done.set()
        self._notify()


class Worker:
    """Runs submitted jobs one at a time, round-robin across owners (see the module docstring), on its own thread."""

    def __init__(self, max_queue: int = LIMITS.worker_line,
                 on_failure: Callable[[BaseException], None] | None = None) -> None:
        self._max_queue = max_queue
        self._ids = itertools.count(1)
        self._on_failure = on_failure
        self._pending: list[JobHandle] = []  # in submission order
        self._pending_lock = threading.Condition()
        self._served: dict[str | None, int] = {}  # owner → the turn it was last served
        self._turns = itertools.count()
        self._closing = False
        self.current: JobHandle | None = None
        self._thread = threading.Thread(target=self._loop, name="h3app-worker", daemon=True)
        self._thread.start()

    @property
    def max_queue(self) -> int:
        return self._max_queue

    def submit(self, run: Callable[[JobContext], Any], label: str = "job", owner: str | None = None) -> JobHandle:
        """Queue ``run`` for ``owner`` (default: ``admission.OWNER`` of the calling context); raises
        :class:`QueueFull` with a clear message when the queue is at its bound."""
        handle = JobHandle(id=next(self._ids), label=label, run=run, owner=owner or OWNER.get())
        with self._pending_lock:
            if len(self._pending) >= self._max_queue:
                raise QueueFull(Reason.WORKER_FULL, limit=self.max_queue)
            self._pending.append(handle)
            self._renumber()
            self._pending_lock.notify_all()
        return handle

    def queued(self) -> list[JobHandle]:
        """The jobs waiting to start, in the order they will start (a snapshot)."""
        with self._pending_lock:
            return self._order()

    def _order(self) -> list[JobHandle]:
        """The pending jobs in serving order: each time, the oldest job of the owner served longest ago."""
        served, pending, order = dict(self._served), list(self._pending), []
        for step in range(len(pending)):
            job = min(pending, key=lambda h: served.get(h.owner, -1))  # min keeps the first (oldest) of equals
            pending.remove(job)
            served[job.owner] = 1 << 62 | step  # after every real turn, in this simulated order
            order.append(job)
        return order

    def _renumber(self) -> None:
        for position, waiting in enumerate(self._order(), start=1):
            if waiting._progress.position != position:
                waiting._progress.position = position
                waiting._notify()

    def _next(self) -> JobHandle | None:
        """Wait for a job and take it off the line (None: the worker is closing)."""
        with self._pending_lock:
            while not self._pending and not self._closing:
                self._pending_lock.wait()
            if not self._pending:
                return None
            handle = self._order()[0]
            self._pending.remove(handle)
            self._served[handle.owner] = next(self._turns)
            self._renumber()
            return handle

    def run(self, run: Callable[[JobContext], Any], label: str = "job", timeout: float | None = None) -> Any:
        """Submit and wait."""
        return self.submit(run, label).result(timeout)

    def _loop(self) -> None:
        while True:
            handle = self._next()
            if handle is None:
                return
            if handle._cancel.is_set():  # never started: nothing to clean up, the adapters stay as they are
                handle._finish(error=Cancelled(why=handle._cancel_reason))
                continue
            self.current = handle
            handle._progress.position, handle._progress.phase = 0, "running"
            try:
                handle._finish(result=handle.run(JobContext(handle)))
            except BaseException as error:  # every failure goes back to the submitter, the worker lives on
                if self._on_failure is not None:
                    try:
                        self._on_failure(error)
                    except BaseException as cleanup_error:
                        error = cleanup_error
                if isinstance(error, Cancelled) and error.why != handle._cancel_reason:
                    error = Cancelled(error.done, error.total, handle._cancel_reason)
                handle._finish(error=error)
            finally:
                self.current = None

    def close(self, timeout: float = 5.0) -> None:
        """Stop once the jobs waiting have run (their submitters wait for them)."""
        with self._pending_lock:
            self._closing = True
            self._pending_lock.notify_all()
        self._thread.join(timeout)


def wait(handle: JobHandle, on_step: Callable[[int, int], None] | None = None,
         on_phase: Callable[[str], None] | None = None, abandoned: Callable[[], bool] | None = None) -> None:
    """Wait for ``handle`` to end while forwarding its progress. ``abandoned()`` (the UI's check of its Gradio event,
    ``h3app.ui.gradio_compat.client_gone``) is polled: when it says nobody waits any more, the job is cancelled at its next step."""
    last = None
    while not handle.done:
        handle.wait_for_change(POLL_SECONDS)
        handle.cancel_if(abandoned)
        progress = handle.progress
        if on_phase is not None and progress.phase != (last.phase if last else None):
            on_phase(progress.phase if progress.phase != "queued" else f"queued (position {progress.position})")
        if on_step is not None and progress.total and (last is None or progress.done != last.done):
            on_step(progress.done, progress.total)
        last = progress


def stream(handle: JobHandle, items: queue.Queue, on_step: Callable[[int, int], None] | None = None,
           abandoned: Callable[[], bool] | None = None) -> Iterator[Any]:
    """Yield what ``handle``'s job puts in ``items`` until the job ends (progress goes to ``on_step`` from a second
    thread; ``abandoned`` as in :func:`wait`). A caller that stops reading cancels the job: nobody waits for the
    rest."""
    end = object()

    def forward() -> None:
        wait(handle, on_step)
        items.put(end)

    threading.Thread(target=forward, daemon=True).start()
    try:
        while True:
            try:
                item = items.get(timeout=POLL_SECONDS)
            except queue.Empty:
                handle.cancel_if(abandoned)
                continue
            if item is end:
                return
            yield item
    finally:
        if not handle.done:
            handle.cancel(CLIENT_GONE)
