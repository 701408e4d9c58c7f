"""Timing: warm-up runs, then the median of several timed runs — of one operation, or of several operations
interleaved round by round so that each sees the same machine load.

On a shared machine the load changes from second to second; timing h3app for ten runs and then its peer for ten
would compare two different machines. ``compare`` runs one timed call of every variant per round (rotating the
order), so a ratio of medians compares like with like.

Two clocks: ``wall`` (``perf_counter``: what a user waits) and ``cpu`` (``process_time``: CPU seconds of this
process, all threads). With one torch thread, CPU time is the work done, and barely moves when other processes
compete for the cores (±4 % where wall time moved ±25 % on the 2-core machine of docs/performance.md); it is
wrong for I/O waits and for work spread over several threads, which use ``wall``.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


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


@dataclass(frozen=True)
class Variant:
    """One contender: ``operation`` is timed; ``setup`` runs before and ``teardown`` after every timed call (both
    untimed: attach the right adapter system, detach it again). ``inner`` > 1 times that many back-to-back calls per
    run and reports the mean per call — for operations of a few microseconds, where one ``perf_counter`` pair would
    be much of the measurement."""

    name: str
    operation: Callable[[], Any]
    setup: Callable[[], Any] | None = None
    teardown: Callable[[], Any] | None = None
    inner: int = 1

    def timed_call(self, clock: str = "wall") -> float:
        now = CLOCKS[clock]
        if self.setup is not None:
            self.setup()
        gc.disable()  # a collection inside a 50 µs operation would be most of its time
        try:
            start = now()
            for _ in range(self.inner):
                self.operation()
            elapsed = (now() - start) / self.inner
        finally:
            gc.enable()
        if self.teardown is not None:
            self.teardown()
        return elapsed


class Alternate:
    """Flip between two values on every call, so that every timed change is a real change (an engine may skip a
    change to the value it already has)."""

    def __init__(self, first: float, second: float) -> None:
        self.values = (first, second)
        self.index = 0

    def __call__(self) -> float:
        self.index ^= 1
        return self.values[self.index]


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def compare(variants: Sequence[Variant], *, repeats: int, warmup: int = 1, clock: str = "wall") -> dict[str, Timing]:
    """``warmup`` untimed calls of each variant, then ``repeats`` rounds of one timed call each (order rotated every
    round), on ``clock`` (``wall`` or ``cpu``). Returns name → Timing."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats} and {warmup}")
    if len({v.name for v in variants}) != len(variants):
        raise ValueError("variant names must be unique")
    for variant in variants:
        if variant.inner < 1:
            raise ValueError(f"inner must be >= 1, got {variant.inner} for {variant.name}")
        for _ in range(warmup):
            variant.timed_call()
    gc.collect()  # once: a full collection costs ~0.3 s once diffusers is imported
    runs: dict[str, list[float]] = {v.name: [] for v in variants}
    for round_index in range(repeats):
        shift = round_index % len(variants)
        for variant in (*variants[shift:], *variants[:shift]):
            runs[variant.name].append(variant.timed_call(clock))
    return {name: Timing(tuple(values)) for name, values in runs.items()}


def measure(operation: Callable[[], Any], *, repeats: int, warmup: int = 1,
            setup: Callable[[], Any] | None = None, inner: int = 1, clock: str = "wall") -> Timing:
    """Time one operation (see ``Variant`` for ``setup`` and ``inner``)."""
    return compare([Variant("only", operation, setup=setup, inner=inner)], repeats=repeats, warmup=warmup,
                   clock=clock)["only"]
