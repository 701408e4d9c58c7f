"""An equivalence check too long for one ZeroGPU call, run as one call per run (``gpu_calls.GpuCalls``).

The check is three whole runs (the fallback, A, B) and the control's one step; when its one call would ask for
more quota than the cap (``zero_gpu.check``), each of those four becomes its own call of a ``jobs.CheckRunJob``,
in the one-call order (``equivalence.PHASES``). Each call is self-contained: it loads the adapter, attaches it at
that run's alpha and strength exactly as the one-call check does at that point (B: attached at A's, then
``set_lora`` to B's), runs under the same deterministic settings and returns the decoded arrays and hash
(:class:`CheckRun`); nothing relies on what a previous call left. The parent then writes the columns and computes
the verdict from those arrays with the one-call check's own code (``equivalence.assemble``), so ``identical``,
the hashes, ``max_abs_diff`` and the rest are the one call's bit for bit; the control compares its step's digest
with A's first step from A's call. Progress counts the whole check; Cancel stops the current call and no more
start. A run that alone is over the cap is refused before any call, in one line saying what fits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..rules.steps import evaluations
from . import zero_gpu
from .check_runs import CheckRun
from .equivalence import PHASES
from .grid_calls import WholeGrid
from .jobs import CheckRunJob, EquivalenceJob, Job
from .worker import Cancelled, JobContext


@dataclass(frozen=True)
class Part:
    """One call of a split check: its run's ``label``, its ``job``, what it declares, and the denoising steps it
    counts in the whole check's progress."""

    label: str
    job: CheckRunJob
    duration: zero_gpu.Duration
    steps: int


def parts(job: Job, duration: Callable[[Job], zero_gpu.Duration]) -> list[Part] | None:
    """The calls ``job`` (a check over the cap) splits into, one per run; None when it is not a check. A run over
    the cap alone raises ``duration``'s one-line refusal (what fits)."""
    if not isinstance(job, EquivalenceJob):
        return None
    steps = max(evaluations(job.request.steps), 1)
    out = []
    for label in PHASES:
        sub = CheckRunJob(job, label)
        out.append(Part(label, sub, duration(sub), 1 if label == "control" else steps))
    return out


def run(split: list[Part], ctx: JobContext, one_call: Callable[[Part, WholeGrid], CheckRun],
        finish: Callable[[dict[str, CheckRun], float], Any]) -> Any:
    """Run ``split`` one call after another (``one_call(part, context)``), progress over the whole check; the
    verdict ``finish(runs, started)`` assembles. Cancel: the current call is closed and no more start."""
    total = sum(part.steps for part in split)
    started, offset = time.perf_counter(), 0
    runs: dict[str, CheckRun] = {}
    for part in split:
        if ctx.should_cancel():
            raise Cancelled(offset, total)
        try:
            runs[part.label] = one_call(part, WholeGrid(ctx, offset, total))
        except Cancelled as stop:
            raise Cancelled(offset + (stop.done or 0), total) from None
        offset += part.steps
    return finish(runs, started)


def record(split: list[Part]) -> dict[str, Any]:
    """What the check's settings say under ``zerogpu`` when it ran as several calls: each call's run and duration."""
    return {"calls": len(split), "runs": [part.label for part in split],
            "durations": [part.duration.to_json() for part in split],
            "quota_s": sum(part.duration.quota_s for part in split), "cap_s": split[0].duration.cap_s,
            "mode": split[0].duration.mode}
