"""A worker job as a value: one small frozen dataclass per kind, holding everything it needs (its request, its
adapters' settings, the token), and ``job.run(ctx, backend, sinks)`` doing it on one process's Backend.

The same value is what every runner of a job gets (docs/architecture.md, "Jobs"):

- the worker runs ``job.run`` on the Backend that queued it (``Backend.submit``: through ``wrap_job``, as it is on
  one rank: :func:`alone`);
- several ranks: rank 0 announces the value and every follower queues that same value on its own Backend
  (``h3app.parallel.lockstep.Lockstep``, ``follower.follow``);
- a ZeroGPU call carries the value, pickled, into its child and runs it there (``gpu_calls``): a job never relies on
  what an earlier job or call left, the binder makes the transformer carry exactly its adapters.

What stays in the submitting process are its :class:`Sinks` (the caller's preview board, a grid's ``on_cell``):
never part of the job, so they never travel (a follower rank has none; a ZeroGPU child forwards to the parent's).
A :data:`JobWrapper` turns (job, sinks, its run here) into what the worker runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..adapters.types import AdapterInfo
from ..lora.report import MatchReport
from ..request import GenerationRequest
from ..rules.check_pair import DEFAULT_A, DEFAULT_B, CheckSetting
from ..rules.choices import T2VA
from ..settings import LoRASettings
from .check_runs import CheckRun, arrived, run_one, travelling
from .equivalence import EquivalenceResult, run_equivalence
from .generation import GenerationResult, run_generation
from .grid import GridCell, GridPlan, baseline_key, run_baseline, run_grid
from .grid_rows import GridRow
from .job_backend import JobBackend
from .outputs import GenerationOutput
from .preview import PreviewBoard
from .worker import JobContext

Run = Callable[[JobContext], Any]  # what the worker runs: a function of the job's context


@dataclass(frozen=True)
class Sinks:
    """Where a running job's side results go in the process that submitted it: ``previews``, the caller's board
    (a preview after every evaluation); ``on_cell``, each grid cell as it finishes."""

    previews: PreviewBoard | None = None
    on_cell: Callable[[GridCell], None] | None = None


NO_SINKS = Sinks()


class Job(Protocol):
    """A worker job: a picklable value naming its ``label`` (the worker's) and the ``workflow`` whose transformer
    partition it runs."""

    @property
    def label(self) -> str: ...

    @property
    def workflow(self) -> str: ...

    def run(self, ctx: JobContext, backend: JobBackend, sinks: Sinks = NO_SINKS) -> Any: ...


JobWrapper = Callable[[Job, Sinks, Run], Run]  # (the job, the caller's sinks, its run here) → what the worker runs


def alone(job: Job, sinks: Sinks, here: Run) -> Run:
    """The job wrapper of one rank: the job run here, as it is."""
    return here


@dataclass(frozen=True)
class LoadResult:
    """An adapter fetched, normalised and bound: its header facts, where it came from, and the match report."""

    info: AdapterInfo
    provenance: dict[str, Any]
    report: MatchReport


@dataclass(frozen=True)
class LoadJob:
    """Fetch (only that file), normalise and bind ``settings``' adapter; result: :class:`LoadResult`."""

    settings: LoRASettings
    workflow: str = T2VA
    token: str | None = field(default=None, repr=False)  # a visitor's HF token: never in a log line

    @property
    def label(self) -> str:
        return f"load {self.settings.source}"

    def run(self, ctx: JobContext, backend: JobBackend, sinks: Sinks = NO_SINKS) -> LoadResult:
        ctx.set_phase("downloading")

        def downloaded(done: int, total: int | None) -> None:
            ctx.on_step(done, total or 0)
            if total is not None and done >= total:
                ctx.set_phase("binding")

        loaded = backend.binder.apply([self.settings], self.workflow, self.token, progress=downloaded)[0]
        return LoadResult(info=loaded.adapter.info, provenance=loaded.provenance(),
                          report=backend.binder.report(self.settings, self.workflow))


def time_record(predicted: dict[str, Any] | None, seconds: float) -> dict[str, Any]:
    """The settings' ``time``: the prediction shown before the click beside the run's seconds ({} without one)."""
    if not predicted:
        return {}
    return {"time": {"predicted_s": predicted["video_s"], "usd_per_video": predicted.get("usd_per_video"),
                     "box": predicted.get("box"), "seconds": round(seconds, 3)}}


@dataclass(frozen=True)
class GenerateJob:
    """Apply exactly ``adapters`` (possibly none), generate, write the mp4; result: ``GenerationOutput``."""

    request: GenerationRequest
    adapters: tuple[LoRASettings, ...] = ()
    token: str | None = field(default=None, repr=False)  # a visitor's HF token: never in a log line
    label = "generate"

    @property
    def workflow(self) -> str:
        return self.request.workflow

    def run(self, ctx: JobContext, backend: JobBackend, sinks: Sinks = NO_SINKS) -> GenerationOutput:
        request = self.request
        predicted = backend.predicted_or_none(request)  # what the page showed before the click
        ctx.set_phase("applying adapters")
        applied = backend.binder.apply(self.adapters, request.workflow, self.token)
        ctx.set_phase("denoising")
        pipe = backend.model.pipeline(request.workflow)
        previews = sinks.previews
        result = run_generation(pipe, request, on_step=ctx.on_step, should_cancel=ctx.should_cancel,
                                listeners=(previews.listener(pipe),) if previews is not None else ())
        backend.last_seconds_per_run = result.seconds
        ctx.set_phase("encoding mp4")
        backend.cleanup_outputs()
        model = backend.model
        return backend.outputs.save_generation(result, {
            "h3app": "generate", "model": model.name, "model_commit": model.location.commit,
            "request": result.request.to_json(), "adapters": [a.provenance() for a in applied],
            "hash": result.hash, "cache": result.cache, **time_record(predicted, result.seconds)})


@dataclass(frozen=True)
class EquivalenceJob:
    """A vs B vs fallback vs control through the full pipeline; result: ``EquivalenceResult``. ``low_rank_only``: B
    rescales only the low-rank parts. Previews: columns ``A``, ``B`` and ``fallback``."""

    request: GenerationRequest
    adapter: LoRASettings
    a: CheckSetting = DEFAULT_A
    b: CheckSetting = DEFAULT_B
    token: str | None = field(default=None, repr=False)  # a visitor's HF token: never in a log line
    low_rank_only: bool = False
    label = "equivalence"

    @property
    def workflow(self) -> str:
        return self.request.workflow

    def run(self, ctx: JobContext, backend: JobBackend, sinks: Sinks = NO_SINKS) -> EquivalenceResult:
        backend.cleanup_outputs()
        result = run_equivalence(backend.binder, self.request, self.adapter, a=self.a, b=self.b,
                                 outputs=backend.outputs, token=self.token, on_step=ctx.on_step,
                                 should_cancel=ctx.should_cancel, on_phase=ctx.set_phase,
                                 low_rank_only=self.low_rank_only, previews=sinks.previews)
        backend.last_seconds_per_run = result.seconds_per_run
        return result


@dataclass(frozen=True)
class CheckRunJob:
    """One run of the equivalence check alone (``run`` in ``equivalence.PHASES``): a check too long for one ZeroGPU
    call runs as one such job per call (``check_calls``); result: ``check_runs.CheckRun``."""

    check: EquivalenceJob  # the whole check this run belongs to
    phase: str

    @property
    def label(self) -> str:
        return f"equivalence {self.phase}"

    @property
    def request(self) -> GenerationRequest:
        return self.check.request

    @property
    def workflow(self) -> str:
        return self.check.workflow

    def run(self, ctx: JobContext, backend: JobBackend, sinks: Sinks = NO_SINKS) -> CheckRun:
        check = self.check
        return run_one(backend.binder, check.request, check.adapter, self.phase, check.a, check.b, token=check.token,
                       low_rank_only=check.low_rank_only, on_step=ctx.on_step, should_cancel=ctx.should_cancel,
                       on_phase=ctx.set_phase, previews=sinks.previews)


@dataclass(frozen=True)
class GridBaseline:
    """A seed's no-LoRA run from its own call, as it travels back and on into its cells' calls (the decoded video
    with its axis order, so a cell's distance to it sums exactly as in the one-call grid)."""

    seed: int
    result: GenerationResult | None

    def __getstate__(self) -> dict[str, Any]:
        return travelling(dict(vars(self)))

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in arrived(state).items():
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class GridJob:
    """The grid, cells streamed to ``sinks.on_cell`` as they finish; result: the cell count. Previews: one column
    per cell and per baseline (``grid.cell_name``). ``baseline_apart``: its seed's no-LoRA run comes from a call of
    its own (``grid_calls``), carried in as ``baseline`` (None until that call has returned)."""

    request: GenerationRequest
    adapter: LoRASettings | tuple[GridRow, ...]
    plan: GridPlan
    token: str | None = field(default=None, repr=False)  # a visitor's HF token: never in a log line
    baseline: GridBaseline | None = None
    baseline_apart: bool = False
    label = "grid"

    @property
    def workflow(self) -> str:
        return self.request.workflow

    def run(self, ctx: JobContext, backend: JobBackend, sinks: Sinks = NO_SINKS) -> int:
        count = 0
        if self.baseline is not None and self.baseline.result is not None:  # carried in: not run again here
            backend.baselines.put(baseline_key(self.request, self.baseline.seed), self.baseline.result)
        for cell in run_grid(backend.binder, self.request, self.adapter, self.plan, outputs=backend.outputs,
                             baselines=backend.baselines, cells=backend.cells, token=self.token,
                             on_step=ctx.on_step, should_cancel=ctx.should_cancel, previews=sinks.previews):
            if sinks.on_cell is not None:
                sinks.on_cell(cell)
            count += 1
        return count


@dataclass(frozen=True)
class GridBaselineJob:
    """A grid's no-LoRA run of ``seed`` alone: a grid split into ZeroGPU calls whose cell and baseline do not fit
    one call runs it as its own call (``grid_calls``); result: :class:`GridBaseline`."""

    request: GenerationRequest
    seed: int
    label = "grid baseline"

    @property
    def workflow(self) -> str:
        return self.request.workflow

    def run(self, ctx: JobContext, backend: JobBackend, sinks: Sinks = NO_SINKS) -> GridBaseline:
        return GridBaseline(self.seed, run_baseline(backend.binder, self.request, self.seed, on_step=ctx.on_step,
                                                    should_cancel=ctx.should_cancel, previews=sinks.previews))

