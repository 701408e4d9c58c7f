"""A grid too long for one ZeroGPU call, run as several calls that each fit (``gpu_calls.GpuCalls``).

A call's quota is capped (``zero_gpu.check``), and a grid is many runs: its cells and, per seed, the no-LoRA
baseline each cell is compared with. When the whole grid is over the cap, it is cut into sub-grids of one seed, one
adapter row, one alpha and as many consecutive strengths as fit one call with their seed's baseline; each sub-grid is
the same ``jobs.GridJob``, so every cell is the one-call grid's cell bit for bit (the baseline is run
again in each call: it is deterministic, and a call's child keeps nothing for the next). When not even one cell and
its baseline fit a call, each seed's baseline is a call of its own (``jobs.GridBaselineJob``: nothing attached)
and each cell's call carries its result in (``jobs.GridBaseline``) and attaches only its row's adapter.
Cells keep the whole grid's row, column and adapter row and arrive in its order, each carrying the calls'
:func:`record`; progress counts the whole grid; Cancel stops the current call and no more start. A grid whose one
run alone is over the cap is refused before any call, in one line saying what fits."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import H3AppError
from ..rules.steps import evaluations
from ..settings import LoRASettings
from . import zero_gpu
from .grid import GridPlan
from .grid_rows import GridRow
from .jobs import GridBaseline, GridBaselineJob, GridJob, Job
from .worker import Cancelled, JobContext


@dataclass(frozen=True)
class Chunk:
    """One call of a split grid: its ``job`` (a sub-grid, or a seed's baseline alone), what it declares, and where
    its cells sit in the whole grid (``row``, ``adapter_row``; ``column`` of its first strength). ``seed``: the seed
    whose baseline call's result it carries (else None)."""

    job: GridJob | GridBaselineJob
    duration: zero_gpu.Duration
    row: int
    column: int
    runs: int  # its cells, and its seed's baseline when it runs it
    adapter_row: int = 0
    seed: int | None = None


def chunks(job: Job, duration: Callable[[Job], zero_gpu.Duration]) -> list[Chunk] | None:
    """The calls ``job`` (a grid over the cap) splits into, each within the cap; None when it is not a whole grid.
    Sub-grids of one seed, one adapter row, one alpha and as many strengths as fit a call with their seed's
    baseline; when not even one cell and its baseline fit, each seed's baseline is a call of its own and the
    cells' calls carry its result. A single run over the cap raises ``duration``'s one-line refusal (what fits)."""
    if not isinstance(job, GridJob) or job.baseline_apart:
        return None
    plan = job.plan
    rows: list[LoRASettings | tuple[GridRow, ...]] = \
        [job.adapter] if isinstance(job.adapter, LoRASettings) else [(row,) for row in job.adapter]
    per_call, apart = _most(job, rows[0], duration, False), False
    if per_call == 0:  # the baseline its own call (refused here when one run alone is over the cap)
        duration(GridBaselineJob(job.request, plan.seeds[0]))
        per_call, apart = _most(job, rows[0], duration, True), True
    if per_call == 0:
        return None
    out = []
    for seed in plan.seeds:
        if apart:
            base = GridBaselineJob(job.request, seed)
            out.append(Chunk(base, duration(base), 0, 0, 1))
        for index, row_adapter in enumerate(rows):
            for alpha_index, alpha in enumerate(plan.alphas):
                for start in range(0, len(plan.strengths), per_call):
                    strengths = plan.strengths[start:start + per_call]
                    sub = _sub(job, row_adapter, alpha, strengths, seed, apart)
                    out.append(Chunk(sub, duration(sub), index * len(plan.alphas) + alpha_index, start,
                                     len(strengths) + (0 if apart else 1), index, seed if apart else None))
    return out


def _most(job: GridJob, adapter: LoRASettings | tuple[GridRow, ...], duration: Callable[[Job], zero_gpu.Duration],
          apart: bool) -> int:
    """The most strengths one call holds (with its seed's baseline, or carried in from its own call when
    ``apart``); 0: none."""
    plan = job.plan
    for width in range(len(plan.strengths), 0, -1):
        try:
            duration(_sub(job, adapter, plan.alphas[0], plan.strengths[:width], plan.seeds[0], apart))
        except H3AppError:
            continue
        return width
    return 0


def _sub(job: GridJob, adapter: LoRASettings | tuple[GridRow, ...], alpha: float | None,
         strengths: tuple[float, ...], seed: int, apart: bool) -> GridJob:
    """A one-seed, one-row, one-alpha sub-grid; ``apart``: its baseline comes from its own call (carried in by
    :func:`run` once that call has returned)."""
    sub_plan: GridPlan = dataclasses.replace(job.plan, alphas=(alpha,), strengths=tuple(strengths), seeds=(seed,),
                                             estimated_seconds=None, adapters=1)
    return GridJob(job.request, adapter, sub_plan, job.token, baseline_apart=apart)


def record(parts: list[Chunk]) -> dict[str, Any]:
    """What a grid split into calls says under ``zerogpu`` (``check_calls.record``'s shape): each call's runs
    ("baseline seed S", or its cells) and duration, the quota they ask for in all."""
    runs = [f"baseline seed {part.job.seed}" if isinstance(part.job, GridBaselineJob) else
            f"row {part.row}, columns {part.column}-{part.column + len(part.job.plan.strengths) - 1}, "
            f"seed {part.job.plan.seeds[0]}" for part in parts]
    return {"calls": len(parts), "runs": runs, "durations": [part.duration.to_json() for part in parts],
            "quota_s": sum(part.duration.quota_s for part in parts), "cap_s": parts[0].duration.cap_s,
            "mode": parts[0].duration.mode}


@dataclass
class WholeGrid:
    """A call's ``JobContext`` as seen by the whole grid: its steps after ``offset`` of ``total``."""

    ctx: JobContext
    offset: int
    total: int
    last: int = 0

    def on_step(self, done: int, total: int) -> None:
        self.last = total
        self.ctx.on_step(self.offset + done, max(self.total, self.offset + total))

    def set_phase(self, phase: str) -> None:
        self.ctx.set_phase(phase)

    def should_cancel(self) -> bool:
        return self.ctx.should_cancel()


def run(parts: list[Chunk], ctx: JobContext, one_call: Callable[[Chunk, Any, Callable[[Any], None] | None], Any],
        on_cell: Callable[[Any], None] | None) -> int:
    """Run ``parts`` one call after another (``one_call(chunk, context, on_cell)``), cells moved to the whole grid's
    row and column and carrying the calls' :func:`record`; a seed's baseline call's result handed to its cells'
    calls. Cancel: the current call is closed and no more start. The cell count."""
    total = sum(part.runs for part in parts) * evaluations(parts[0].job.request.steps)
    calls = record(parts)
    offset, count = 0, 0
    baselines: dict[int, GridBaseline] = {}
    for part in parts:
        if ctx.should_cancel():
            raise Cancelled(offset, total)
        whole = WholeGrid(ctx, offset, total)

        def moved(cell: Any, part: Chunk = part) -> None:
            if on_cell is not None:
                on_cell(dataclasses.replace(cell, row=part.row, column=part.column + cell.column,
                                            adapter_row=part.adapter_row, zerogpu=calls))

        try:
            if isinstance(part.job, GridBaselineJob):
                base = one_call(part, whole, None)
                baselines[base.seed] = base
            else:
                job = part.job if part.seed is None else dataclasses.replace(part.job, baseline=baselines[part.seed])
                count += one_call(dataclasses.replace(part, job=job), whole, moved)
        except Cancelled as stop:
            raise Cancelled(offset + (stop.done or 0), total) from None
        offset += whole.last
    return count
