"""The strength profile's torch-free half: how large each LoRA update is relative to its weight, summarised, and
the alpha-size heuristic. ``h3app/lora/profile.py`` measures the norms (torch); the engine builds the profile and
the UI shows it, both from here.

The "usual range" is a heuristic, stated in docs/lora-engine.md: a well-scaled LoRA fine-tune changes a typical
(median) layer by 1e-3 to 1e-2 of its Frobenius norm. The warning fires only when no alpha was stored (the rank
fallback) and the median at alpha = rank is more than ``FAR_ABOVE_FACTOR`` times the top of that range.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# Median relative update ‖ΔW‖_F/‖W‖_F of a well-scaled adapter (heuristic; see docs/lora-engine.md).
USUAL_RELATIVE_UPDATE = (1e-3, 1e-2)
# "Far above": only warn when the median is this many times the top of the usual range.
FAR_ABOVE_FACTOR = 4.0

_BLOCK = re.compile(r"^((?:token_refiner\.refiner_blocks|transformer_blocks)\.\d+)\.")


def block_of(target: str) -> str:
    """``transformer_blocks.7`` / ``token_refiner.refiner_blocks.1`` for block targets, ``global`` otherwise."""
    match = _BLOCK.match(target)
    return match.group(1) if match else "global"


@dataclass(frozen=True)
class TargetStrength:
    """One target: ``relative_update = |scale| · update_norm / weight_norm``."""

    target: str
    block: str
    group: str
    scale: float
    update_norm: float
    weight_norm: float

    @property
    def relative_update(self) -> float:
        if self.weight_norm == 0.0:
            return math.inf if self.update_norm * self.scale != 0.0 else 0.0
        return abs(self.scale) * self.update_norm / self.weight_norm


@dataclass(frozen=True)
class StrengthSummary:
    """Median / min / max relative update over ``count`` targets."""

    count: int
    median: float
    minimum: float
    maximum: float

    def to_json(self) -> dict[str, float | int]:
        return {"count": self.count, "median": self.median, "min": self.minimum, "max": self.maximum}


def _summarise(values: Iterable[float]) -> StrengthSummary:
    values = list(values)
    return StrengthSummary(len(values), float(statistics.median(values)), float(min(values)), float(max(values)))


@dataclass(frozen=True)
class StrengthProfile:
    """Relative updates per target, summarised per block and per group (groups as in ``h3app.rules.h3_modules``)."""

    targets: tuple[TargetStrength, ...]
    per_block: Mapping[str, StrengthSummary]
    per_group: Mapping[str, StrengthSummary]
    overall: StrengthSummary

    def to_json(self) -> dict:
        return {
            "usual_range": list(USUAL_RELATIVE_UPDATE),
            "overall": self.overall.to_json(),
            "per_group": {group: summary.to_json() for group, summary in self.per_group.items()},
            "per_block": {block: summary.to_json() for block, summary in self.per_block.items()},
            "targets": {t.target: t.relative_update for t in self.targets},
        }


def build_profile(targets: Iterable[TargetStrength]) -> StrengthProfile | None:
    """Summaries of ``targets``; None when there are none."""
    targets = tuple(targets)
    if not targets:
        return None
    by_block: dict[str, list[float]] = {}
    by_group: dict[str, list[float]] = {}
    for t in targets:
        by_block.setdefault(t.block, []).append(t.relative_update)
        by_group.setdefault(t.group, []).append(t.relative_update)
    return StrengthProfile(
        targets=targets,
        per_block={block: _summarise(v) for block, v in by_block.items()},
        per_group={group: _summarise(v) for group, v in by_group.items()},
        overall=_summarise(t.relative_update for t in targets),
    )


@dataclass(frozen=True)
class AlphaSuggestion:
    """At alpha = rank the median relative update is ``median_at_rank``; any alpha in ``[low, high]`` puts the median
    inside ``USUAL_RELATIVE_UPDATE``; ``suggested`` is the power of two nearest (in log scale) to the alpha that puts
    it at the range's geometric centre."""

    median_at_rank: float
    low: float
    high: float
    suggested: float

    def message(self) -> str:
        lo, hi = USUAL_RELATIVE_UPDATE
        return (
            f"no alpha stored, so alpha = rank (scale 1): the median relative update ‖ΔW‖/‖W‖ is "
            f"{self.median_at_rank:.2g}, {self.median_at_rank / hi:.0f}x above the usual {lo:g}-{hi:g}; "
            f"alpha {self.suggested:g} (any alpha in {self.low:.3g}-{self.high:.3g}) brings it into that range — "
            f"give that alpha explicitly unless the adapter's card says alpha = rank"
        )


def suggest_alpha(
    update_norms: Mapping[str, float],
    weight_norms: Mapping[str, float],
    ranks: Mapping[str, int],
    divisors: Mapping[str, float],
    *,
    strength: float = 1.0,
) -> AlphaSuggestion | None:
    """If the adapter at alpha = rank is far above the usual range, the explicit alpha that brings its median
    relative update into range; else None.

    ``divisors`` are rank (or √rank for rsLoRA) per target. With one alpha for every module the relative update of
    target m is ``alpha · |strength| · u_m / divisor_m`` (``u_m = update_norm/weight_norm``), so the median over
    targets is linear in alpha. At alpha = rank each module uses its own rank as alpha.
    """
    lo, hi = USUAL_RELATIVE_UPDATE
    targets = [t for t in update_norms if weight_norms.get(t, 0.0) > 0.0]
    if not targets:
        return None
    per_unit = {t: abs(strength) * update_norms[t] / weight_norms[t] / divisors[t] for t in targets}
    median_at_rank = float(statistics.median(ranks[t] * per_unit[t] for t in targets))
    if median_at_rank <= FAR_ABOVE_FACTOR * hi:
        return None
    per_unit_alpha = float(statistics.median(per_unit.values()))
    if per_unit_alpha <= 0.0:
        return None
    centre = math.sqrt(lo * hi) / per_unit_alpha
    suggested = 2.0 ** round(math.log2(centre))
    return AlphaSuggestion(median_at_rank, lo / per_unit_alpha, hi / per_unit_alpha, suggested)
