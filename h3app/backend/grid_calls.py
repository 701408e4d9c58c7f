"""A grid too long for one ZeroGPU call, run as several calls that each fit (``gpu_calls.GpuCalls``).

A call's quota is capped (``zero_gpu.check``), and a grid is many runs: its cells and, per seed, the no-LoRA
baseline each cell is compared with. When the whole grid is over the cap, it is cut into sub-grids of one seed, one
alpha and as many consecutive strengths as fit one call with their seed's baseline; each sub-grid is the same
``Backend.submit_grid`` job, so every cell is the one-call grid's cell bit for bit (the baseline is run again in
each call: it is deterministic, and a call's child keeps nothing for the next). Cells keep the whole grid's row and
column and arrive in its order; progress counts the whole grid; Cancel stops between calls or inside one. A grid
of several adapter rows, or one whose single cell and baseline do not fit a call, is refused as before.
"""

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
    """One call of a split grid: its ``call`` (the sub-grid's ``submit_grid``), what it declares, and where its cells
    sit in the whole grid (``row``; ``column`` of its first strength)."""

    call: JobCall
    duration: zero_gpu.Duration
    row: int
    column: int
    runs: int  # its cells and its seed's baseline


def chunks(call: JobCall, duration: Callable[[JobCall], zero_gpu.Duration]) -> list[Chunk] | None:
    """The calls ``call`` (a grid over the cap) splits into, each within the cap (``duration`` refuses otherwise);
    None when it is not a one-adapter grid or not even one cell and its baseline fit a call."""
    if getattr(call.submit, "__name__", "") != "submit_grid" or len(call.args) != 4:
        return None
    request, adapter, plan, token = call.args
    if not isinstance(adapter, LoRASettings):
        return None
    per_call = 0
    for width in range(len(plan.strengths), 0, -1):  # the most strengths one call holds
        try:
            duration(_sub(call, plan, plan.alphas[0], plan.strengths[:width], plan.seeds[0]))
        except H3AppError:
            continue
        per_call = width
        break
    if per_call == 0:
        return None
    out = []
    for seed in plan.seeds:
        for row, alpha in enumerate(plan.alphas):
            for start in range(0, len(plan.strengths), per_call):
                strengths = plan.strengths[start:start + per_call]
                sub = _sub(call, plan, alpha, strengths, seed)
                out.append(Chunk(sub, duration(sub), row, start, len(strengths) + 1))
    return out


def _sub(call: JobCall, plan: Any, alpha: float | None, strengths: tuple[float, ...], seed: int) -> JobCall:
    request, adapter, _, token = call.args
    sub_plan = dataclasses.replace(plan, alphas=(alpha,), strengths=tuple(strengths), seeds=(seed,),
                                   estimated_seconds=None)
    return dataclasses.replace(call, args=(request, adapter, sub_plan, token))


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
    row and column; the cell count."""
    request = parts[0].call.args[0]
    total = sum(part.runs for part in parts) * evaluations(request.steps)
    offset, count = 0, 0
    for part in parts:
        if ctx.should_cancel():
            from .worker import Cancelled

            raise Cancelled(offset, total)
        whole = WholeGrid(ctx, offset, total)

        def moved(cell: Any, part: Chunk = part) -> None:
            if on_cell is not None:
                on_cell(dataclasses.replace(cell, row=part.row, column=part.column + cell.column))

        count += one_call(part, whole, moved)
        offset += whole.last
    return count
