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
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from ..rules.strength import (  # noqa: F401 — the profile's torch-free half, re-exported for the engine
    FAR_ABOVE_FACTOR,
    USUAL_RELATIVE_UPDATE,
    AlphaSuggestion,
    StrengthProfile,
    StrengthSummary,
    TargetStrength,
    block_of,
    build_profile,
    suggest_alpha,
)
from .layers import rows_per_chunk


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
    rows = rows_per_chunk(A.shape[1])
    return sum(float((B[start:start + rows] @ A).pow(2).sum(dtype=torch.float64)) for start in range(0, B.shape[0], rows))


def weight_norm(weight: torch.Tensor) -> float:
    """``‖W‖_F`` in float64 (accumulated in fp32 row blocks to bound memory for bf16 weights)."""
    total = 0.0
    rows = rows_per_chunk(weight.shape[-1])
    for start in range(0, weight.shape[0], rows):
        chunk = weight[start:start + rows].to(torch.float32)
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

            def forget(_: weakref.ref) -> None:  # the adapter is gone: its id may be reused by another
                self._updates.pop(key, None)

            held = (weakref.ref(adapter, forget), {})
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
