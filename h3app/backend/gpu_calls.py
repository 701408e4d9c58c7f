"""Every job as one self-contained ZeroGPU call (``Backend.wrap_job`` under ``zero_gpu.mode()``).

On ZeroGPU the GPU exists only inside a decorated call, which runs in a forked child: what the call changes in the
model (attached adapters, merged weights, caches) does not outlive it, and a later call may find a fresh fork of the
parent or a reused child. So a job never relies on what a previous one left: the call carries the job value itself
(``jobs``: it holds its request, adapters and token), pickled, and the child runs it on its copy of the Backend,
whose binder makes the transformer carry exactly the job's adapters, unmerged and scaled, then decodes and returns
the result (arrays and file paths), all inside the call.

Parent side (:class:`GpuCalls`, on the worker thread): the duration the call declares (``zero_gpu.declared`` from
the time model's prediction, checked against the cap before anything is asked for), the call made in the submitter's
context (``spaces`` reads the visitor — the Gradio request whose quota is charged — from context variables, which a
worker thread would not have), the child's progress, previews and grid cells fed to the caller's handle and sinks
(board, ``on_cell``), and Cancel: the call is closed (the child stops at its next step; the visitor's quota stops
being charged). Child side (:func:`call_in_child`): the job run on a thread, its events yielded every
:data:`~h3app.backend.worker.POLL_SECONDS`.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import pickle
import queue
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import H3AppError
from ..request import GenerationRequest
from . import check_calls, grid_calls, zero_gpu
from .check_runs import CheckRun, assemble
from .equivalence import EquivalenceResult
from .job_backend import JobBackend
from .jobs import CheckRunJob, EquivalenceJob, GridBaselineJob, GridJob, Job, Run, Sinks
from .preview import Preview, PreviewBoard
from .worker import POLL_SECONDS, Cancelled, JobContext, JobHandle

_BACKENDS: dict[int, JobBackend] = {}  # id → Backend: the child finds its forked copy here (set before any fork)


@dataclass(frozen=True)
class Payload:
    """What travels to the child (pickled): which Backend, the job, which of the caller's sinks exist (``board``:
    the board's settings, None without one; ``on_cell``), and the declared seconds."""

    backend: int
    job: Job
    board: dict[str, Any] | None
    on_cell: bool
    duration_s: int


def _duration_of(payload: Payload) -> int:
    return payload.duration_s


class _ForwardBoard(PreviewBoard):
    """The child's board: previews, notes and thinned steps also go to ``events`` (the parent's board gets them)."""

    def __init__(self, events: queue.Queue, decoder: str, audio: bool | None, budget: float | None) -> None:
        super().__init__(None, decoder, audio, budget)
        self.events = events

    def put(self, preview: Preview) -> None:
        super().put(preview)
        self.events.put(("board.put", preview))

    def note(self, text: str) -> None:
        super().note(text)
        self.events.put(("board.note", text))

    def skipped(self) -> None:
        super().skipped()
        self.events.put(("board.skipped", None))


def _portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling with its words, else an ``H3AppError`` with them."""
    try:
        back = pickle.loads(pickle.dumps(error))
        if str(back) == str(error):
            return back
    except Exception:  # an error that cannot travel is sent as its words
        pass
    return H3AppError(str(error)) if isinstance(error, H3AppError) else RuntimeError(f"{type(error).__name__}: {error}")


def _measured(result: Any) -> Any:
    """``result`` ready to travel: a Load's match report measures its strength profile here, in the call, where the
    weights it measures are, and keeps it as a value (its lazy measure is a closure over this child's engine)."""
    report = getattr(result, "report", None)
    if report is not None and getattr(report, "measure", None) is not None:
        report.profile  # noqa: B018 - cached on the report
        object.__setattr__(report, "measure", None)
    return result


def call_in_child(payload: Payload) -> Generator[tuple[str, Any], None, None]:
    """The decorated call (in the child): run the job on this process's Backend, on a thread, yield its events
    (``progress``, ``phase``, ``board.*``, ``cell``), then ``("result", value)`` or ``("error", …)``.
    Closed early (the parent cancelled): the job is cancelled at its next step and waited for."""
    backend, job = _BACKENDS[payload.backend], payload.job
    events: queue.Queue = queue.Queue()
    board = _ForwardBoard(events, **payload.board) if payload.board is not None else None
    sinks = Sinks(board, (lambda cell: events.put(("cell", cell))) if payload.on_cell else None)
    handle = JobHandle(id=0, label=job.label, run=lambda ctx: job.run(ctx, backend, sinks))
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = handle.run(JobContext(handle))
        except BaseException as error:  # sent to the parent below, as the job's error
            outcome["error"] = error
        events.put(("end", None))

    thread = threading.Thread(target=run, name="h3app-gpu-call", daemon=True)
    thread.start()
    try:
        yield from _events(handle, events)
    finally:
        if thread.is_alive():  # closed early: stop the job at its next step
            handle.cancel()
            thread.join()
    yield ("seconds_per_run", backend.last_seconds_per_run)
    if isinstance(outcome.get("error"), Cancelled):  # words rebuilt in the parent from the counts
        yield ("cancelled", (outcome["error"].done, outcome["error"].total))
    elif "error" in outcome:
        yield ("error", _portable(outcome["error"]))
    else:
        yield ("result", _measured(outcome["result"]))


def _events(handle: JobHandle, events: queue.Queue) -> Iterator[tuple[str, Any]]:
    """The job's events until it ends; a heartbeat at least every POLL_SECONDS (so a stop is seen between steps)."""
    seen = None
    while True:
        progress = handle.progress
        now = (progress.phase, progress.done, progress.total)
        if now != seen:
            seen = now
            yield ("progress", now)
        try:
            kind, value = events.get(timeout=POLL_SECONDS)
        except queue.Empty:
            yield ("heartbeat", None)
            continue
        if kind == "end":
            progress = handle.progress
            if (progress.phase, progress.done, progress.total) != seen:
                yield ("progress", (progress.phase, progress.done, progress.total))
            return
        yield (kind, value)


@functools.cache
def _gpu_call(home: str | None) -> Callable[[Payload], Generator[tuple[str, Any], None, None]]:
    """:func:`call_in_child` decorated for ``home`` (``zero_gpu.mode()``), once: at the Backend's creation, before
    the app launches (``spaces`` reports its decorated calls at launch)."""
    return zero_gpu.gpu(call_in_child, _duration_of)


@dataclass
class GpuCalls:
    """The job wrapper of a Backend under ZeroGPU (or its stand-in): each job one GPU call, sized by
    ``duration(job)`` (the request's prediction on this card; :func:`duration_for`)."""

    backend: JobBackend
    duration: Callable[[Job], zero_gpu.Duration]
    calls: list[zero_gpu.Duration] = field(default_factory=list)

    def __post_init__(self) -> None:
        _BACKENDS[id(self.backend)] = self.backend
        self.home = zero_gpu.mode()
        self.call = _gpu_call(self.home)

    def __call__(self, job: Job, sinks: Sinks, here: Run) -> Run:
        """``job`` as one GPU call carrying it (or, over the cap, a check or a grid as several calls that each
        fit); ``here`` (its run in this process) is not used: the GPU is only inside a call."""
        context = contextvars.copy_context()  # the submitter's: its Gradio request names the visitor to charge
        try:  # refused here, before anything is queued, when over the cap
            duration = self._duration(job)
        except H3AppError:
            split = check_calls.parts(job, self._duration)  # a check: one call per run
            if split is not None:
                return lambda ctx: self._split_check(context, split, sinks, ctx)
            parts = grid_calls.chunks(job, self._duration)  # a grid: several calls that each fit
            if parts is None:
                raise
            return lambda ctx: grid_calls.run(
                parts, ctx, lambda part, whole, moved: self._one(context, part.job, part.duration, whole,
                                                                 sinks.previews, moved), sinks.on_cell)
        return lambda ctx: self._one(context, job, duration, ctx, sinks.previews, sinks.on_cell)

    def _split_check(self, context: contextvars.Context, split: list[check_calls.Part], sinks: Sinks,
                     ctx: JobContext) -> EquivalenceResult:
        """A check over the cap as one call per run; the verdict assembled here, its settings naming the calls."""
        job = split[0].job.check  # the whole check its runs belong to

        def finish(runs: dict[str, CheckRun], started: float) -> EquivalenceResult:
            self.backend.cleanup_outputs()
            result = assemble(runs, job.request, job.a, job.b, job.low_rank_only, self.backend.outputs,
                              self.backend.model, started)
            result.settings["zerogpu"] = check_calls.record(split)
            self.backend.last_seconds_per_run = result.seconds_per_run
            return result

        return check_calls.run(split, ctx, lambda part, whole: self._one(context, part.job, part.duration, whole,
                                                                          sinks.previews, None), finish)

    def _duration(self, job: Job) -> zero_gpu.Duration:
        return dataclasses.replace(self.duration(job), mode=self.home)

    def _one(self, context: contextvars.Context, job: Job, duration: zero_gpu.Duration,
             ctx: JobContext | grid_calls.WholeGrid, board: PreviewBoard | None,
             on_cell: Callable[[Any], None] | None) -> Any:
        """``job`` as one GPU call declaring ``duration``; its result (a generation's settings carry ``zerogpu``)."""
        spec = {"decoder": board.decoder, "audio": board.audio, "budget": board.budget} if board is not None else None
        payload = Payload(id(self.backend), job, spec, on_cell is not None, duration.duration_s)
        self.calls.append(duration)
        result = _follow(self.call, context, payload, ctx, board, on_cell, self.backend)
        settings = getattr(result, "settings", None)
        if isinstance(settings, dict):
            settings["zerogpu"] = duration.to_json()
        return result


def _follow(gpu_call: Callable[[Payload], Generator[tuple[str, Any], None, None]], context: contextvars.Context,
            payload: Payload, ctx: JobContext | grid_calls.WholeGrid, board: PreviewBoard | None,
            on_cell: Callable[[Any], None] | None, backend: JobBackend) -> Any:
    """Make the call (in the submitter's ``context``) and feed its events to ``ctx``, ``board`` and ``on_cell``;
    a cancel closes the call and raises :class:`Cancelled` with the steps done."""
    items = context.run(gpu_call, payload)
    done, total = 0, 0
    try:
        while True:
            try:
                kind, value = context.run(next, items)
            except StopIteration:
                raise H3AppError("the ZeroGPU call ended without a result (GPU task aborted).") from None
            if kind == "progress":
                phase, done, total = value
                if phase not in ("queued", "running"):
                    ctx.set_phase(phase)
                if total:
                    ctx.on_step(done, total)
            elif kind.startswith("board.") and board is not None:
                getattr(board, kind.removeprefix("board."))(*(() if value is None else (value,)))
            elif kind == "cell" and on_cell is not None:
                on_cell(value)
            elif kind == "seconds_per_run":
                backend.last_seconds_per_run = value if value is not None else backend.last_seconds_per_run
            elif kind == "error":
                raise value
            elif kind == "cancelled":
                raise Cancelled(*value)
            elif kind == "result":
                return value
            if ctx.should_cancel():
                raise Cancelled(done if total else None, total if total else None)
    finally:
        context.run(items.close)  # ends the call: the child stops at its next step, the quota stops being charged


def duration_for(backend: JobBackend, job: Job) -> zero_gpu.Duration:
    """The seconds ``job``'s call declares: the time model's prediction for its request on this card (a generate:
    the video; a check: ``check_s``, its three runs and control step; a grid: each cell and each seed's baseline,
    unless a split grid's baseline ran as its own call) plus the margin; a Load: the stated allowance. Over the cap:
    refused in one line saying what fits."""
    request = getattr(job, "request", None)  # every job that runs the pipeline holds its request
    if not isinstance(request, GenerationRequest):  # a Load (download + bind): no denoising to predict
        return zero_gpu.check(zero_gpu.declared(None), f"{zero_gpu.CAP_ENV} is below what a Load needs: raise it")
    predicted = backend.predicted_time(request)
    if not predicted or predicted.get("video_s") is None:
        raise H3AppError("no time prediction for this request on this card, so no ZeroGPU duration can be asked "
                         "for: this is a bug, report it.")
    video = float(predicted["video_s"])
    if isinstance(job, EquivalenceJob):  # three runs and the control's one step (the prediction's check_s)
        work = float(predicted.get("check_s") or 3 * video + float(predicted.get("step_s") or 0.0))
        fits = f"the check is 3 runs of about {video:.0f} s each and one step; {_steps_that_fit(predicted, 3, 1)}"
    elif isinstance(job, CheckRunJob):  # one run of a check split into calls (check_calls); the control: one step
        work = float(predicted.get("step_s") or 0.0) if job.phase == "control" else video
        fits = (f"a check too long for one call runs as one call per run, and one run is about {video:.0f} s; "
                f"{_steps_that_fit(predicted, 1, 0)}")
    elif isinstance(job, GridBaselineJob):  # a seed's no-LoRA run, its own call in a split grid (grid_calls)
        work = video
        fits = (f"a grid too long for one call runs as calls of one run or more, and one run is about {video:.0f} s; "
                f"{_steps_that_fit(predicted, 1, 0)}")
    elif isinstance(job, GridJob):
        plan = job.plan
        runs = plan.cells + (0 if job.baseline_apart else len(plan.seeds))  # each cell, and each seed's baseline
        work = runs * video
        fits = (f"{runs} runs (cells and baselines) of about {video:.0f} s; at most "
                f"{max(int(zero_gpu.largest_work_s() // video), 0)} such runs fit one call: a smaller grid, or "
                f"{_steps_that_fit(predicted, runs, 0)}")
    else:
        work, fits = video, _steps_that_fit(predicted, 1, 0)
    return zero_gpu.check(zero_gpu.declared(work), fits)


def _steps_that_fit(predicted: dict[str, Any], runs: int, extra_steps: int) -> str:
    """What makes ``runs`` runs and ``extra_steps`` single steps fit one call: the most steps at this canvas and
    length (steps count evaluations + 1), else a shorter clip or a Turbo preset."""
    step, evaluations = float(predicted.get("step_s") or 0.0), int(predicted.get("evaluations") or 0)
    fixed = float(predicted["video_s"]) - step * evaluations  # a run's seconds outside its evaluations
    room = zero_gpu.largest_work_s() - extra_steps * step - runs * fixed
    most = int(room / (runs * step)) + 1 if step > 0 else 0
    steps = f"use at most {most} steps" if most >= 2 else "fewer steps alone do not fit"
    return f"{steps}, a shorter clip or a smaller canvas, or a Turbo preset (4 steps)"
