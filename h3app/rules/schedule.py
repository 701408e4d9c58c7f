"""A strength schedule: one factor per transformer evaluation of a run, multiplying the adapter's strength.

Two spellings (``parse_schedule``), the same on the command line, in ``--adapter-spec``, the UI, the API and the
settings JSON:

- a **list**, one factor per evaluation: ``"1,1,0.5,0.5"`` (commas, semicolons or spaces). Its length must equal
  the run's evaluations (N steps run N − 1), else the run is refused in one line naming both numbers;
- a **curve**: ``constant:V``, ``linear:START:END`` or ``cosine:START:END``, optionally ``@FROM-TO`` (fractions of
  the run, default ``@0-1``). Evaluation ``i`` of ``n`` sits at fraction ``p = i / (n − 1)`` (0 for a single one);
  inside ``[FROM, TO]`` the factor runs from START at FROM to END at TO (``t = (p − FROM) / (TO − FROM)``; linear
  ``START + (END − START)·t``, cosine ``START + (END − START)·(1 − cos πt)/2``, constant ``V``); outside the window
  the adapter is off (factor 0), as ComfyUI's start/end percent switch a patch on and off.

The factor multiplies the strength (so a schedule on both sides of the equivalence check keeps A and B equal).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import H3AppError
from . import values

CURVES = ("constant", "linear", "cosine")
SCHEDULE_EXAMPLE = "1,1,0.5,0.5 · linear:1:0.5 · cosine:1:0@0.2-0.8 · constant:0.5@0-0.5"  # each spelling, once
MAX_VALUES = 1000  # a list longer than any run: a typo, not a schedule
_EDGE = 1e-12  # fractions on the window's edges (i / (n − 1) against a typed 0.5) count as inside


@dataclass(frozen=True)
class StrengthSchedule:
    """Either ``factors`` (a list, one per evaluation) or a ``curve`` from ``start`` to ``end`` over ``window``."""

    factors: tuple[float, ...] = ()
    curve: str | None = None
    start: float = 1.0
    end: float = 1.0
    window: tuple[float, float] = (0.0, 1.0)

    @property
    def label(self) -> str:
        """The canonical spelling (``parse_schedule(label)`` gives this schedule back)."""
        if self.curve is None:
            return ",".join(f"{value:g}" for value in self.factors)
        values_text = f"{self.start:g}" if self.curve == "constant" else f"{self.start:g}:{self.end:g}"
        window = "" if self.window == (0.0, 1.0) else f"@{self.window[0]:g}-{self.window[1]:g}"
        return f"{self.curve}:{values_text}{window}"

    def per_evaluation(self, count: int) -> tuple[float, ...]:
        """The factor of each of ``count`` evaluations; a list of another length is refused (one line, both
        numbers)."""
        if self.curve is None:
            if len(self.factors) != count:
                raise H3AppError(
                    f"the strength schedule has {len(self.factors)} values but this run has {count} evaluations: "
                    f"give {count} values (one per evaluation; N steps run N − 1), or a curve such as "
                    f"linear:1:0.5.")
            return self.factors
        return tuple(self.at(index / (count - 1) if count > 1 else 0.0) for index in range(count))

    def at(self, fraction: float) -> float:
        """The curve's factor at ``fraction`` of the run (0 outside its window)."""
        low, high = self.window
        if fraction < low - _EDGE or fraction > high + _EDGE:
            return 0.0
        if self.curve == "constant":
            return self.start
        t = min(max((fraction - low) / (high - low), 0.0), 1.0) if high > low else 0.0
        shape = t if self.curve == "linear" else (1.0 - math.cos(math.pi * t)) / 2.0
        return self.start + (self.end - self.start) * shape


def parse_schedule(text: object, what: str = "strength schedule") -> StrengthSchedule | None:
    """``"1,1,0.5"``, ``"linear:1:0.5"``, ``"cosine:1:0@0.2-0.8"``, ``"constant:0.5@0-0.5"`` → a schedule; empty
    or None → None (no schedule)."""
    if text is None:
        return None
    if isinstance(text, StrengthSchedule):
        return text
    if not isinstance(text, str):
        raise H3AppError(f"{what} must be text such as 1,1,0.5,0.5 or linear:1:0.5, got {values.short(text)}.")
    text = values.check_length(text.strip(), what)
    if not text:
        return None
    head = text.split(":", 1)[0].strip().lower()
    if head in CURVES:
        return _parse_curve(head, text, what)
    if ":" in text or "@" in text:
        raise H3AppError(f"{what}: unknown curve in {values.short(text)}; use a list such as 1,1,0.5,0.5 or "
                         f"{' | '.join(CURVES)} as in linear:1:0.5@0.2-1.")
    items = [item for item in text.replace(";", ",").replace(" ", ",").split(",") if item.strip()]
    if len(items) > MAX_VALUES:
        raise H3AppError(f"{what} has {len(items)} values, more than the {MAX_VALUES} allowed.")
    return StrengthSchedule(factors=tuple(values.parse_strength(item, f"{what} value") for item in items))


def _parse_curve(curve: str, text: str, what: str) -> StrengthSchedule:
    body, _, window_text = text.partition("@")
    numbers = [part.strip() for part in body.split(":")[1:]]
    wanted = 1 if curve == "constant" else 2
    if len(numbers) != wanted or not all(numbers):
        example = "constant:0.5" if curve == "constant" else f"{curve}:1:0.5"
        raise H3AppError(f"{what}: {curve} takes {'one value' if wanted == 1 else 'a start and an end value'}, "
                         f"e.g. {example}; got {values.short(text)}.")
    start = values.parse_strength(numbers[0], f"{what} start")
    end = values.parse_strength(numbers[-1], f"{what} end")
    return StrengthSchedule(curve=curve, start=start, end=end if wanted == 2 else start,
                            window=_parse_window(window_text, text, what) if window_text.strip() else (0.0, 1.0))


def _parse_window(window: str, text: str, what: str) -> tuple[float, float]:
    low_text, sep, high_text = window.strip().partition("-")
    if not sep:
        raise H3AppError(f"{what}: the window is FROM-TO fractions of the run, e.g. @0.2-0.8; got {values.short(text)}.")
    low = values.parse_number(low_text, f"{what} window start")
    high = values.parse_number(high_text, f"{what} window end")
    if not 0.0 <= low <= high <= 1.0:
        raise H3AppError(f"{what}: the window needs 0 ≤ FROM ≤ TO ≤ 1 (fractions of the run), got @{low:g}-{high:g}.")
    return (low, high)
