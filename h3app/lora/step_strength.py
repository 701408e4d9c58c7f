"""A strength schedule during a run: before each evaluation, the adapter's scale entries are refilled with that
evaluation's factor (``h3app.rules.schedule``) — the same fp32 tensors refilled in place as a slider change, so a
compiled graph runs on — and its exact deltas are rewritten from their pristine copies when their factor moves;
after the run, whatever its end, the factor is 1 again. A schedule whose length is not the run's evaluation count is
refused in ``run_starting``, before anything runs.
"""

from __future__ import annotations

from collections.abc import Callable

from ..rules.schedule import StrengthSchedule
from .evaluations import Evaluation, EvaluationListener, RunSchedule
from .exact import PartStrength
from .scaling import AdapterScale


class StepStrength(EvaluationListener):
    """One adapter's schedule: ``schedule`` is the one its settings hold now (None: no schedule, nothing happens;
    the engine sets it at attach and at every settings change, so a run reads it unparsed);
    ``parts``/``rewrite_parts``: its exact deltas' strength and their writer (None when it has no deltas)."""

    def __init__(self, adapter: str, state: AdapterScale, schedule: StrengthSchedule | None,
                 parts: PartStrength | None = None, rewrite_parts: Callable[[], None] | None = None) -> None:
        self.adapter = adapter
        self.state = state
        self.schedule = schedule
        self.parts = parts
        self._rewrite = rewrite_parts
        self.factors: tuple[float, ...] | None = None
        self.log: list[tuple[int, float]] | None = None  # (evaluation, factor) when set

    def run_starting(self, schedule: RunSchedule) -> None:
        plan = self.schedule
        self.factors = plan.per_evaluation(schedule.count) if plan is not None else None

    def before_evaluation(self, evaluation: Evaluation) -> None:
        if self.factors is not None:
            factor = self.factors[min(evaluation.index, len(self.factors) - 1)]
            if self.log is not None:
                self.log.append((evaluation.index, factor))
            self._set(factor)

    def run_finished(self) -> None:
        if self.factors is not None:
            self.factors = None
            self._set(1.0)

    def _set(self, factor: float) -> None:
        self.state.set_step(factor)
        if self.parts is not None and self._rewrite is not None and self.parts.step != factor:
            self.parts.step = factor
            self._rewrite()
