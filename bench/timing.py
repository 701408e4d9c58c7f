"""Wall-clock timing of one operation: warm-up runs, then the median of several timed runs.

Each timed run may have an untimed ``setup`` (e.g. detach the adapter the previous run attached), so that every
timed run measures the same work from the same starting state.
"""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Timing:
    """Seconds of each timed run (warm-ups excluded)."""

    runs: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def best(self) -> float:
        return min(self.runs)

    @property
    def spread(self) -> float:
        """(max − min) / median: how noisy the runs were (0 = identical)."""
        return (max(self.runs) - min(self.runs)) / self.median if self.median > 0 else 0.0


def measure(operation: Callable[[], Any], *, repeats: int, warmup: int = 1,
            setup: Callable[[], Any] | None = None, inner: int = 1) -> Timing:
    """Time ``operation`` ``repeats`` times after ``warmup`` untimed calls.

    ``setup`` runs (untimed) before every call, warm-ups included. ``inner`` > 1 times that many back-to-back calls
    per run and reports the mean per call — for operations of a few microseconds, where one ``perf_counter`` pair
    would be most of the measurement (``setup`` then runs once per run, not per call).
    """
    if repeats < 1 or inner < 1:
        raise ValueError(f"repeats and inner must be >= 1, got {repeats} and {inner}")
    for _ in range(warmup):
        if setup is not None:
            setup()
        operation()
    runs: list[float] = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        gc.collect()
        gc.disable()  # a collection inside a 50 µs operation would be most of its time
        try:
            start = time.perf_counter()
            for _ in range(inner):
                operation()
            runs.append((time.perf_counter() - start) / inner)
        finally:
            gc.enable()
    return Timing(tuple(runs))
