"""A grid too long for one ZeroGPU call, run as several calls that each fit (``gpu_calls.GpuCalls``).

A call's quota is capped (``zero_gpu.check``), and a grid is many runs: its cells and, per seed, the no-LoRA
baseline each cell is compared with. When the whole grid is over the cap, it is cut into sub-grids of one seed, one
adapter row, one alpha and as many consecutive strengths as fit one call with their seed's baseline; each sub-grid is
the same ``Backend.submit_grid`` job, so every cell is the one-call grid's cell bit for bit (the baseline is run
again in each call: it is deterministic, and a call's child keeps nothing for the next). When not even one cell and
its baseline fit a call, each seed's baseline is a call of its own (``Backend.submit_grid_baseline``: nothing
attached) and each cell's call carries its result in (:class:`GridBaseline`) and attaches only its row's adapter.
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
from .worker import JobCall, JobContext


@dataclass(frozen=True)
class Chunk:
    """One call of a split grid: its ``call`` (a sub-grid's ``submit_grid``, or a seed's baseline alone:
    ``submit_grid_baseline``), what it declares, and where its cells sit in the whole grid (``row``, ``adapter_row``;
    ``column`` of its first strength). ``seed``: the seed whose baseline call's result it carries (else None)."""

    call: JobCall
    duration: zero_gpu.Duration
    row: int
    column: int
    runs: int  # its cells, and its seed's baseline when it runs it
    adapter_row: int = 0
    seed: int | None = None

    @property
    def is_baseline(self) -> bool:
        return getattr(self.call.submit, "__name__", "") == "submit_grid_baseline"


@dataclass(frozen=True)
class GridBaseline:
    """A seed's no-LoRA run from its own call, as it travels back and on into its cells' calls (the decoded video
    with its axis order, so a cell's distance to it sums exactly as in the one-call grid)."""

    seed: int
    result: Any  # GenerationResult

    def __getstate__(self) -> dict[str, Any]:
        from .check_runs import travelling

        return travelling(dict(vars(self)))

    def __setstate__(self, state: dict[str, Any]) -> None:
        from .check_runs import arrived

        for name, value in arrived(state).items():
            object.__setattr__(self, name, value)


def chunks(call: JobCall, backend: Any, duration: Callable[[JobCall], zero_gpu.Duration]) -> list[Chunk] | None:
    """The calls ``call`` (a grid over the cap) splits into, each within the cap; None when it is not a grid.
    Sub-grids of one seed, one adapter row, one alpha and as many strengths as fit a call with their seed's
    baseline; when not even one cell and its baseline fit, each seed's baseline is a call of its own and the
    cells' calls carry its result. A single run over the cap raises ``duration``'s one-line refusal (what fits)."""
    if getattr(call.submit, "__name__", "") != "submit_grid" or len(call.args) != 4:
        return None
    request, adapter, plan, _ = call.args
    rows: list[Any] = [adapter] if isinstance(adapter, LoRASettings) else [[row] for row in adapter]
    per_call, alone = _most(call, rows[0], plan, duration, None), False
    if per_call == 0:  # the baseline its own call (refused here when one run alone is over the cap)
        baseline = dataclasses.replace(call, submit=type(backend).submit_grid_baseline, args=(request, plan.seeds[0]))
        duration(baseline)
        per_call, alone = _most(call, rows[0], plan, duration, plan.seeds[0]), True
    if per_call == 0:
        return None
    out = []
    for seed in plan.seeds:
        if alone:
            base = dataclasses.replace(call, submit=type(backend).submit_grid_baseline, args=(request, seed))
            out.append(Chunk(base, duration(base), 0, 0, 1))
        for index, row_adapter in enumerate(rows):
            for alpha_index, alpha in enumerate(plan.alphas):
                for start in range(0, len(plan.strengths), per_call):
                    strengths = plan.strengths[start:start + per_call]
                    sub = _sub(call, row_adapter, plan, alpha, strengths, seed, seed if alone else None)
                    out.append(Chunk(sub, duration(sub), index * len(plan.alphas) + alpha_index, start,
                                     len(strengths) + (0 if alone else 1), index, seed if alone else None))
    return out


def _most(call: JobCall, adapter: Any, plan: Any, duration: Callable[[JobCall], zero_gpu.Duration],
          carried: int | None) -> int:
    """The most strengths one call holds (with its seed's baseline, or ``carried`` in from its own call); 0: none."""
    for width in range(len(plan.strengths), 0, -1):
        try:
            duration(_sub(call, adapter, plan, plan.alphas[0], plan.strengths[:width], plan.seeds[0], carried))
        except H3AppError:
            continue
        return width
    return 0


def _sub(call: JobCall, adapter: Any, plan: Any, alpha: float | None, strengths: tuple[float, ...], seed: int,
         carried: int | None) -> JobCall:
    """A one-seed, one-row, one-alpha sub-grid; ``carried``: its baseline comes from its own call (filled in by
    :func:`run` once that call has returned; None until then)."""
    request, _, _, token = call.args[:4]
    sub_plan = dataclasses.replace(plan, alphas=(alpha,), strengths=tuple(strengths), seeds=(seed,),
                                   estimated_seconds=None, adapters=1)
    return dataclasses.replace(call, args=(request, adapter, sub_plan, token,
                                           *(() if carried is None else (None,))))


def record(parts: list[Chunk]) -> dict[str, Any]:
    """What a grid split into calls says under ``zerogpu`` (``check_calls.record``'s shape): each call's runs
    ("baseline seed S", or its cells) and duration, the quota they ask for in all."""
    runs = [f"baseline seed {part.call.args[1]}" if part.is_baseline else
            f"row {part.row}, columns {part.column}-{part.column + len(part.call.args[2].strengths) - 1}, "
            f"seed {part.call.args[2].seeds[0]}" for part in parts]
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
    from .worker import Cancelled

    request = parts[0].call.args[0]
    total = sum(part.runs for part in parts) * evaluations(request.steps)
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
            if part.is_baseline:
                base = one_call(part, whole, None)
                baselines[base.seed] = base
            else:
                call = part.call if part.seed is None else dataclasses.replace(
                    part.call, args=(*part.call.args[:4], baselines[part.seed]))
                count += one_call(dataclasses.replace(part, call=call), whole, moved)
        except Cancelled as stop:
            raise Cancelled(offset + (stop.done or 0), total) from None
        offset += whole.last
    return count
