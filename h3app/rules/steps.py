"""Steps and transformer evaluations: ``num_inference_steps`` counts sigma points *including* the terminal 0, so N
steps run N − 1 evaluations (fewer only when a flow shift collapses duplicate sigmas:
``backend.generation.count_evaluations`` asks the scheduler for that exact count)."""

from __future__ import annotations

MIN_STEPS = 2  # one evaluation: the fewest a run can have
MAX_STEPS = 200  # the most a request may ask for (a hosted server allows fewer: ``backend.limits``)


def evaluations(steps: int) -> int:
    """The transformer evaluations of ``steps`` sigma points (N → N − 1)."""
    return max(int(steps) - 1, 0)
