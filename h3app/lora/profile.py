"""Strength profile: how large each LoRA update is relative to the weight it changes, ‖scale·B·A‖_F / ‖W‖_F.

It answers "is this alpha plausible?" for adapters nobody has catalogued. ``‖B·A‖_F`` is computed without
forming ``B·A`` (which would be ``out × in``, e.g. 96768 × 2688 for an AdaLN projection) through the two ``r × r``
Gram matrices: ``‖BA‖_F² = trace(AᵀBᵀBA) = trace((BᵀB)(AAᵀ)) = Σ_ij (BᵀB)_ij (AAᵀ)_ij`` (both are symmetric) — when
the rank is below ``min(in, out)``; a larger rank is measured through ``B·A`` in row blocks instead.
Nothing is measured at attach (unless the rank-fallback warning needs it): ``NormMemo`` measures ``‖B·A‖_F`` per
target on the first request for a profile, memoised per adapter, and ``‖W‖_F`` once per model target, so a profile
for new settings is a few multiplications per target.

The "usual range" is a heuristic, stated in docs/lora-engine.md: a well-scaled LoRA fine-tune changes a typical
(median) layer by 1e-3 to 1e-2 of its Frobenius norm. The warning fires only when no alpha was stored (the
rank fallback) and the median at alpha = rank is more than ``FAR_ABOVE_FACTOR`` times the top of that range.
"""

from __future__ import annotations

import math
import re
import statistics
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import torch

# Median relative update ‖ΔW‖_F/‖W‖_F of a well-scaled adapter (heuristic; see docs/lora-engine.md).
USUAL_RELATIVE_UPDATE = (1e-3, 1e-2)
# "Far above": only warn when the median is this many times the top of the usual range.
FAR_ABOVE_FACTOR = 4.0

_BLOCK = re.compile(r"^((?:token_refiner\.refiner_blocks|transformer_blocks)\.\d+)\.")


def block_of(target: str) -> str:
    """``transformer_blocks.7`` / ``token_refiner.refiner_blocks.1`` for block targets, ``global`` otherwise."""
    match = _BLOCK.match(target)
    return match.group(1) if match else "global"


def update_norm(down: torch.Tensor, up: torch.Tensor) -> float:
    """``‖B·A‖_F`` for ``A = down [r, in]`` and ``B = up [out, r]`` (fp32 products, float64 sum), without forming
    ``B·A``: through the ``r × r`` Gram matrices when ``r < min(in, out)`` (cost ``O((in + out)·r²)``, memory
    ``O(r²)``), else through ``B·A`` by row blocks (cost ``O(out·in·r)``, memory bounded): an absurd rank never
    costs ``O(r²)`` memory. The engine refuses ranks above ``in + out``."""
    A = down.to(torch.float32)
    B = up.to(torch.float32)
    if A.shape[0] < min(A.shape[1], B.shape[0]):
        squared = _gram_squared(A, B)
    else:
        squared = _product_squared(A, B)
    return math.sqrt(max(squared, 0.0))


def _gram_squared(A: torch.Tensor, B: torch.Tensor) -> float:
    gram_a = A @ A.T  # [r, r]
    gram_b = B.T @ B  # [r, r]
    return float((gram_a.double() * gram_b.double()).sum())


def _product_squared(A: torch.Tensor, B: torch.Tensor) -> float:
    rows = max(1, (64 << 20) // max(1, A.shape[1] * 4))
    return sum(float((B[start:start + rows] @ A).pow(2).sum(dtype=torch.float64)) for start in range(0, B.shape[0], rows))


def weight_norm(weight: torch.Tensor) -> float:
    """``‖W‖_F`` in float64 (accumulated in fp32 row blocks to bound memory for bf16 weights)."""
    total = 0.0
    rows_per_chunk = max(1, (64 << 20) // max(1, weight.shape[-1] * 4))
    for start in range(0, weight.shape[0], rows_per_chunk):
        chunk = weight[start:start + rows_per_chunk].to(torch.float32)
        total += float(chunk.pow(2).sum(dtype=torch.float64))
    return math.sqrt(total)


class NormMemo:
    """``‖B·A‖_F`` per target, memoised per adapter — the normalised adapter object, which the adapter cache hands
    out once per file version, partition and q/k/v layout, and which holds the factors — and ``‖W‖_F`` per model
    target (the base weights do not change while the model is held)."""

    def __init__(self) -> None:
        self._weights: dict[str, float] = {}
        self._updates: dict[int, tuple[weakref.ref, dict[str, float]]] = {}

    def update_norms(self, adapter: Any, modules: Mapping[str, Any],
                     device: Callable[[str], torch.device]) -> dict[str, float]:
        """target → ``‖B·A‖_F`` for ``modules`` (``ModuleLoRA`` of ``adapter``), computed on ``device(target)``."""
        key = id(adapter)
        held = self._updates.get(key)
        if held is None or held[0]() is not adapter:
            held = (weakref.ref(adapter, lambda _, key=key: self._updates.pop(key, None)), {})
            self._updates[key] = held
        norms = held[1]
        with torch.no_grad():
            for target, module in modules.items():
                if target not in norms:
                    where = device(target)
                    norms[target] = update_norm(module.down.detach().to(where), module.up.detach().to(where))
        return {target: norms[target] for target in modules}

    def weight_norms(self, targets: Iterable[str], base_rows: Callable[[str], torch.Tensor]) -> dict[str, float]:
        """target → ``‖W‖_F`` of its base rows (``base_rows(target)``, ``[out, in]``)."""
        with torch.no_grad():
            for target in targets:
                if target not in self._weights:
                    self._weights[target] = weight_norm(base_rows(target))
        return {target: self._weights[target] for target in targets}


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
