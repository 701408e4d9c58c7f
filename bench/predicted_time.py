"""P6's predicted-time rows: the time the page shows before Generate (``hardware.estimate.TimeModel`` on this CPU, at
rates measured now by ``cpu_peaks``) over the seconds the same request takes on the same loaded tiny model, in the
same process. Ratio = predicted / measured: the goal is within 2× either way.

One evaluation: the median gap between the run's progress calls (each comes before an evaluation; the last gap,
which also holds the decodes, is left out). The whole run: ``GenerationResult.seconds`` (text encoder, every
evaluation and both decodes) against the prediction's ``video_s``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .table import Goal, Row

CASE = "P6"
WITHIN_TWO = Goal("0.5×–2×", max_ratio=2.0, min_ratio=0.5)


def evaluation_seconds(stamps: Sequence[float]) -> list[float]:
    """Seconds of each evaluation from the progress calls' times (one before each evaluation, one at the end): the
    gaps between them, less the last (the final evaluation with the decodes after it)."""
    gaps = [later - earlier for earlier, later in zip(stamps, stamps[1:])]
    return gaps[:-1]


def rows(loaded: Any, request: Any, repeats: int, clock: str) -> list[Row]:
    """Two rows for ``request`` on ``loaded`` (the tiny model): one evaluation and the whole run, predicted over
    measured (medians of ``repeats`` runs after a warm-up)."""
    from h3app.backend.generation import run_generation
    from h3app.hardware.estimate import for_app
    from h3app.model import repo

    model = for_app(repo.TINY, loaded.options)  # the app's own time model for this load
    peaks = model.peaks
    predicted = model(request)
    pipe = loaded.pipeline(request.workflow)
    run_generation(pipe, request)  # warm-up (the prompt cache is warm after it, as in the app)
    steps, runs = [], []
    for round_ in range(max(1, repeats)):
        stamps: list[float] = []
        fresh = replace(request, seed=(request.seed or 0) + 1 + round_)  # a new seed: no cached block or decode
        result = run_generation(pipe, fresh, on_step=lambda done, total, at=stamps: at.append(time.perf_counter()))
        steps.extend(evaluation_seconds(stamps))
        runs.append(result.seconds)
    note = (f"prediction on this CPU: {peaks.fp32:.3g} TFLOP/s fp32, {peaks.memory_tbps * 1e3:.3g} GB/s, "
            f"{peaks.op_overhead_s * 1e6:.1f} µs per op (cpu_peaks, measured in this run)")
    return [Row(CASE, "predicted ÷ measured: one evaluation (tiny, this CPU)", predicted["step_s"],
                "measured evaluation", statistics.median(steps), WITHIN_TWO,
                f"{note}; {len(steps)} evaluations", clock, extra={"predicted": predicted}),
            Row(CASE, f"predicted ÷ measured: whole run, {request.steps} steps (tiny, this CPU)", predicted["video_s"],
                "measured run", statistics.median(runs), WITHIN_TWO,
                f"{note}; decode predicted {predicted['decode_s']} s", clock)]
